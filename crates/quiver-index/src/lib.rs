//! Quiver's vector index: k-means IVF lists, RaBitQ 1-bit codes with an unbiased
//! estimator and error bound, rescoring with stored full vectors, exact (flat)
//! search as the reference, and the segment file format v1 (writer and reader).
//!
//! The crate does no I/O of its own: the writer emits bytes into any
//! `std::io::Write`, the reader pulls ranges through a [`ByteSource`] that hands
//! out borrowed slices (a memory buffer, a mapped file, or the search node's cache).

mod build_pool;
mod calibrate;
mod codebook;
mod direct_io;
mod error;
mod fields;
mod filter;
mod format;
mod huge_pages;
mod kmeans;
mod params;
mod rabitq;
mod reader;
mod rotation;
mod search;
mod source;
mod writer;

pub use calibrate::{
    Calibration, CalibrationOptions, DEFAULT_EXACT_WORK, DEFAULT_SAMPLE_QUERIES, MAX_PROBE_RATIO,
    MIN_SAMPLE_QUERIES, WIDE_SAMPLE_QUERIES, calibrate_group, calibrate_nprobe,
};
pub use codebook::{Codebook, CodebookInfo};
pub use direct_io::{DirectFileWriter, map_read_back};
pub use error::{IndexError, IndexErrorKind, IndexResult};
pub use fields::{FieldColumn, FieldKind, FieldSpec, FieldValue};
pub use filter::{CompareOp, FieldValues, Filter, Literal, MAX_FILTER_DEPTH};
pub use format::{ChunkChecksums, FORMAT_VERSION, SectionEntry, SectionKind, SegmentChunk};
pub use huge_pages::{HUGE_PAGE_BYTES, advice_range};
pub use params::{
    BuildParams, CALIBRATED_K, CALIBRATED_WIDE_K, CalibratedProbe, IdType, MAX_STRING_ID_BYTES,
    MIN_ROWS_PER_HIT, Metric, RawPrecision, SearchParams, default_nlist, default_nprobe,
    max_ratio_probes, probe_for_k,
};
pub use reader::Segment;
pub use search::{
    Hit, RowFilter, SearchScratch, SearchStats, SharedProbe, SharedSearch, merge_hits,
    search_shared,
};
pub use source::{
    AccessPattern, ByteSource, DirectSession, MappedAdvice, MemorySource, MmapSource, ReadAhead,
    ReadSession,
};
pub use writer::{
    BuildProgress, BuildStage, MAX_SQUARED_LENGTH, PointId, SegmentHeader, SegmentSpec,
    SegmentSummary, SegmentWriter, normalize_into, normalized, validate_id, validate_point,
    validate_query, validate_vector,
};
