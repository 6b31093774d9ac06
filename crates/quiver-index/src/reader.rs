//! Segment reader: opens a segment through any [`ByteSource`] with two range reads
//! (trailer, footer), keeps the small hot parts (header, centroids, list
//! directory) decoded, and verifies every other chunk's checksum the first time it
//! is read — or, for a source that keeps copies it may fetch again (the cache),
//! hands the checksums to the source, which checks every copy it makes — so
//! damaged bytes become an error naming the object, never an answer.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{IndexError, IndexResult};
use crate::fields::{self, FieldColumn};
use crate::format::{self, ChunkChecksums, SectionEntry, SectionKind, TRAILER_BYTES};
use crate::params::{IdType, RawPrecision};
use crate::rabitq::FACTOR_BLOCK_BYTES;
use crate::rotation::{Rotation, padded_dimension};
use crate::source::{AccessPattern, ByteSource, ReadSession};
use crate::writer::{PointId, SegmentHeader};

/// Rows whose payload offsets [`Segment::for_each_payload`] reads at a time.
pub(crate) const PAYLOAD_SCAN_ROWS: u64 = 4096;

/// The most payload text [`Segment::for_each_payload`] reads in one piece
/// (unless one row's alone is larger).
pub(crate) const PAYLOAD_SCAN_BYTES: u64 = 4 << 20;

/// One IVF list: its rows and code blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListEntry {
    pub row_start: u32,
    pub rows: u32,
    pub block_start: u32,
}

/// An open, immutable segment.
pub struct Segment<S: ByteSource> {
    pub(crate) source: S,
    pub(crate) header: SegmentHeader,
    sections: Vec<SectionEntry>,
    checksums: Arc<ChunkChecksums>,
    /// Chunks checked so far (all set when the source checks its own copies).
    verified_chunks: Vec<AtomicU64>,
    /// What a search ranks and scores lists by, derived from the centroids;
    /// one copy per codebook in the process ([`centroid_tables`]).
    pub(crate) tables: Arc<CentroidTables>,
    pub(crate) lists: Vec<ListEntry>,
    pub(crate) rotation: Rotation,
}

/// What a search ranks and scores a segment's lists by, derived from its rotated
/// centroids (which stay in the file: [`Segment::rotated_centroids`]).
pub(crate) struct CentroidTables {
    /// The centroids as bf16 bit patterns: what a search scores its shortlisted
    /// lists with (~1.5 centroids per probed list, scattered over the table).
    /// Half the bytes of the f32 table to read per query and to keep in memory;
    /// the rounding (2⁻⁹ relative per coordinate) moves an inner product by
    /// ~10⁻⁴ of ‖q‖‖c‖, far inside the RaBitQ estimate's own error, and exact
    /// scores come from the full vectors.
    pub(crate) bf16: Vec<u16>,
    /// 1-bit codes of the centroids, to shortlist the lists to probe.
    pub(crate) list_codes: crate::rabitq::ListCodes,
    /// ‖c‖² of every rotated centroid.
    pub(crate) norms: Vec<f32>,
    /// Σ c_i of every rotated centroid.
    pub(crate) sums: Vec<f32>,
}

/// A codebook's tables, by codebook id, padded dimension and probe metric.
type TablesKey = (u64, usize, crate::params::Metric);

/// The tables of every codebook some open segment uses: a shard's segments are
/// built with one codebook (flushes and merges alike), so they share one copy
/// instead of holding one each.
static SHARED_TABLES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<TablesKey, std::sync::Weak<CentroidTables>>>,
> = std::sync::LazyLock::new(Default::default);

/// Returns the tables of `centroids` (rotated, as read from a segment with
/// `header`): the copy another open segment of the same codebook holds when
/// there is one (its bf16 table checked equal), else a new one.
fn centroid_tables(
    header: &SegmentHeader,
    centroids: &[f32],
    probe_metric: crate::params::Metric,
) -> Arc<CentroidTables> {
    let bf16: Vec<u16> = centroids
        .iter()
        .map(|&value| quiver_simd::f32_to_bf16_bits(value))
        .collect();
    let key = header
        .codebook
        .map(|codebook| (codebook.id, header.padded_dim, probe_metric));
    let shared = || SHARED_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(key) = key
        && let Some(tables) = shared().get(&key).and_then(std::sync::Weak::upgrade)
        && tables.bf16 == bf16
    {
        return tables;
    }
    let padded_dim = header.padded_dim;
    let tables = Arc::new(CentroidTables {
        bf16,
        list_codes: crate::rabitq::ListCodes::new(centroids, padded_dim, probe_metric),
        norms: centroids
            .chunks_exact(padded_dim)
            .map(|c| quiver_simd::dot_f32(c, c))
            .collect(),
        sums: centroids
            .chunks_exact(padded_dim)
            .map(|c| c.iter().sum())
            .collect(),
    });
    if let Some(key) = key {
        let mut shared = shared();
        shared.retain(|_, tables| tables.strong_count() > 0);
        shared.insert(key, Arc::downgrade(&tables));
    }
    tables
}

fn cast<'b, T: bytemuck::Pod>(object: &str, what: &str, bytes: &'b [u8]) -> IndexResult<&'b [T]> {
    bytemuck::try_cast_slice(bytes).map_err(|error| {
        IndexError::corrupted(
            object,
            format!("{what} cannot be read as an array: {error}"),
        )
    })
}

impl<S: ByteSource> Segment<S> {
    /// Reads and checks the layout and the small sections (two range reads for
    /// trailer and footer, then the sections kept decoded).
    #[allow(clippy::type_complexity)]
    fn read_layout(
        source: &S,
    ) -> IndexResult<(
        Vec<SectionEntry>,
        Vec<u32>,
        SegmentHeader,
        Vec<f32>,
        Vec<ListEntry>,
    )> {
        let object = source.name().to_string();
        let size = source.size();
        if size < TRAILER_BYTES as u64 {
            return Err(IndexError::corrupted(
                &object,
                format!("object is only {size} bytes"),
            ));
        }
        let trailer = {
            let bytes = source.read_at(size - TRAILER_BYTES as u64, TRAILER_BYTES)?;
            format::decode_trailer(&object, size, &bytes)?
        };
        let sections = {
            let footer = source.read_at(trailer.footer_offset, trailer.footer_length as usize)?;
            if crc32c::crc32c(&footer) != trailer.footer_crc {
                return Err(IndexError::corrupted(&object, "footer checksum mismatch"));
            }
            format::decode_footer(&object, &footer, trailer.footer_offset)?
        };
        let entry = |kind: SectionKind| *sections.iter().find(|e| e.kind == kind).expect("checked");
        // How the big sections will be read, said before anything near them is
        // read: a mapped file's codes must come in as huge folios (see
        // `MappedAdvice`), and the small sections below share their first page.
        let codes = entry(SectionKind::Codes);
        source.advise(
            codes.offset,
            codes.length as usize,
            AccessPattern::Sequential,
        );
        let raw = entry(SectionKind::RawVectors);
        source.advise(raw.offset, raw.length as usize, AccessPattern::Random);
        // The small sections read below, asked for together: a cache fetches the
        // ones it misses at once (one round trip, not one per section).
        source.fetch_ahead(
            &[
                SectionKind::ChunkChecksums,
                SectionKind::Header,
                SectionKind::Centroids,
                SectionKind::ClusterDirectory,
            ]
            .map(|kind| (entry(kind).offset, entry(kind).length as usize)),
        );

        let read_whole = |kind: SectionKind| -> IndexResult<Vec<u8>> {
            let entry = entry(kind);
            let bytes = source.read_at(entry.offset, entry.length as usize)?;
            if crc32c::crc32c(&bytes) != entry.crc {
                return Err(IndexError::corrupted(
                    &object,
                    format!("{} section checksum mismatch", kind.name()),
                ));
            }
            Ok(bytes.to_vec())
        };

        let chunk_crcs: Vec<u32> =
            bytemuck::pod_collect_to_vec(&read_whole(SectionKind::ChunkChecksums)?);
        let mut expected_first = 0u64;
        for section in sections
            .iter()
            .filter(|e| e.kind != SectionKind::ChunkChecksums)
        {
            if section.first_chunk as u64 != expected_first {
                return Err(IndexError::corrupted(
                    &object,
                    "chunk checksum table does not match the sections",
                ));
            }
            expected_first += section.chunk_count();
        }
        if chunk_crcs.len() as u64 != expected_first {
            return Err(IndexError::corrupted(
                &object,
                "chunk checksum table has the wrong length",
            ));
        }

        let header: SegmentHeader = serde_json::from_slice(&read_whole(SectionKind::Header)?)
            .map_err(|error| {
                IndexError::corrupted(&object, format!("header is not valid: {error}"))
            })?;
        validate_header(&object, &header)?;

        let words = header.padded_dim / 64;
        let rows = header.rows;
        let expected_lengths = [
            (
                SectionKind::Centroids,
                (header.nlist * header.padded_dim * 4) as u64,
            ),
            (SectionKind::ClusterDirectory, (header.nlist * 12) as u64),
            (
                SectionKind::Codes,
                (header.blocks * (words * header.block_rows * 8 + FACTOR_BLOCK_BYTES)) as u64,
            ),
            (
                SectionKind::RawVectors,
                rows * (header.dim * header.raw_precision.value_bytes()) as u64,
            ),
        ];
        for (kind, expected) in expected_lengths {
            if entry(kind).length != expected {
                return Err(IndexError::corrupted(
                    &object,
                    format!(
                        "{} section is {} bytes, expected {expected}",
                        kind.name(),
                        entry(kind).length
                    ),
                ));
            }
        }
        let minimum_lengths = [
            (
                SectionKind::RowIds,
                match header.id_type {
                    IdType::U64 => rows * 8,
                    IdType::String => (rows + 1) * 4,
                },
            ),
            (SectionKind::Payloads, (rows + 1) * 8),
            (
                SectionKind::IdLookup,
                match header.id_type {
                    IdType::U64 => rows * 12,
                    IdType::String => rows * 4,
                },
            ),
        ];
        for (kind, minimum) in minimum_lengths {
            if entry(kind).length < minimum {
                return Err(IndexError::corrupted(
                    &object,
                    format!("{} section is truncated", kind.name()),
                ));
            }
        }

        let centroids: Vec<f32> =
            bytemuck::pod_collect_to_vec(&read_whole(SectionKind::Centroids)?);
        let directory: Vec<u32> =
            bytemuck::pod_collect_to_vec(&read_whole(SectionKind::ClusterDirectory)?);
        let lists: Vec<ListEntry> = directory
            .chunks_exact(3)
            .map(|entry| ListEntry {
                row_start: entry[0],
                rows: entry[1],
                block_start: entry[2],
            })
            .collect();
        let (mut next_row, mut next_block) = (0u64, 0u64);
        for list in &lists {
            if list.row_start as u64 != next_row || list.block_start as u64 != next_block {
                return Err(IndexError::corrupted(
                    &object,
                    "list directory is inconsistent",
                ));
            }
            next_row += list.rows as u64;
            next_block += (list.rows as u64).div_ceil(header.block_rows as u64);
        }
        if next_row != rows || next_block != header.blocks as u64 {
            return Err(IndexError::corrupted(
                &object,
                "list directory does not cover the rows",
            ));
        }

        Ok((sections, chunk_crcs, header, centroids, lists))
    }

    /// Opens the segment in `source`, checking its layout and small sections.
    pub fn open(source: S) -> IndexResult<Self> {
        let (sections, chunk_crcs, header, centroids, lists) = match Self::read_layout(&source) {
            Ok(layout) => layout,
            Err(error) => {
                // A cache must not keep serving the damaged bytes: the next open
                // fetches them again (a damaged transfer heals, a damaged object
                // fails the same way).
                if error.kind() == crate::error::IndexErrorKind::Corrupted {
                    source.discard(0, source.size());
                }
                return Err(error);
            }
        };
        let checksums = Arc::new(ChunkChecksums::new(&sections, &chunk_crcs));
        // A cache fetches a region again after evicting it, so a chunk checked once
        // here could later be served from bytes nobody checked: a source that
        // keeps copies checks each one itself, once per fetch.
        let source_verifies = source.verify_with(&checksums);
        let verified_chunks = (0..chunk_crcs.len().div_ceil(64))
            .map(|_| AtomicU64::new(if source_verifies { u64::MAX } else { 0 }))
            .collect();
        let rotation = Rotation::new(header.dim, header.rotation_seed);
        let probe_metric = if header.metric == crate::params::Metric::Dot {
            crate::params::Metric::Dot
        } else {
            crate::params::Metric::L2
        };
        let tables = centroid_tables(&header, &centroids, probe_metric);
        let segment = Segment {
            source,
            header,
            sections,
            checksums,
            verified_chunks,
            tables,
            lists,
            rotation,
        };
        Ok(segment)
    }

    /// Returns the segment's header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Returns the number of rows.
    pub fn rows(&self) -> u64 {
        self.header.rows
    }

    /// Returns the object name of the underlying source.
    pub fn name(&self) -> &str {
        self.source.name()
    }

    /// Returns the number of rows in every IVF list.
    pub fn list_sizes(&self) -> Vec<u32> {
        self.lists.iter().map(|list| list.rows).collect()
    }

    /// Returns the section table.
    pub fn sections(&self) -> &[SectionEntry] {
        &self.sections
    }

    /// Returns the byte source the segment reads from.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Tells whether `self` and `other` rank lists with one in-memory copy of
    /// their codebook's tables (bf16 centroids, their 1-bit codes, norms and
    /// sums): open segments built with one codebook do.
    pub fn shares_centroid_tables_with<T: ByteSource>(&self, other: &Segment<T>) -> bool {
        Arc::ptr_eq(&self.tables, &other.tables)
    }

    /// Reads the rotated centroids (f32, as trained) from the segment's
    /// centroid section, its checksums verified (an open segment keeps only
    /// the tables derived from them).
    pub fn rotated_centroids(&self) -> IndexResult<Vec<f32>> {
        let bytes = self.read_section(SectionKind::Centroids)?;
        let values: &[u8] = &bytes;
        Ok(bytemuck::pod_collect_to_vec(values))
    }

    /// Returns the bytes that stay hot during search: centroids, list directory,
    /// codes with their factors.
    pub fn hot_bytes(&self) -> u64 {
        [
            SectionKind::Centroids,
            SectionKind::ClusterDirectory,
            SectionKind::Codes,
        ]
        .into_iter()
        .map(|kind| self.section(kind).length)
        .sum()
    }

    pub(crate) fn section(&self, kind: SectionKind) -> SectionEntry {
        *self
            .sections
            .iter()
            .find(|entry| entry.kind == kind)
            .expect("every kind is present")
    }

    /// Reads `length` bytes at `offset` inside section `kind`, verifying the
    /// checksum of every chunk touched the first time it is read.
    pub(crate) fn read(
        &self,
        kind: SectionKind,
        offset: u64,
        length: usize,
    ) -> IndexResult<S::Bytes<'_>> {
        let absolute = self.checked_range(kind, offset, length)?;
        self.source.read_at(absolute, length)
    }

    /// Reads all of section `kind`, asked for ahead first
    /// ([`ByteSource::read_ahead`]): one read-ahead, not a fault per page.
    pub(crate) fn read_section(&self, kind: SectionKind) -> IndexResult<S::Bytes<'_>> {
        let entry = self.section(kind);
        self.source.read_ahead(entry.offset, entry.length as usize);
        self.read(kind, 0, entry.length as usize)
    }

    /// Like [`Segment::read`], through a read session of this segment's source.
    #[inline]
    pub(crate) fn read_in<'s, R: ReadSession>(
        &self,
        session: &'s R,
        kind: SectionKind,
        offset: u64,
        length: usize,
    ) -> IndexResult<Cow<'s, [u8]>> {
        let absolute = self.checked_range(kind, offset, length)?;
        session.read_at(absolute, length)
    }

    /// Returns the object offset of a range inside section `kind`, after checking
    /// it is inside the section and verifying the chunks it touches.
    #[inline]
    fn checked_range(&self, kind: SectionKind, offset: u64, length: usize) -> IndexResult<u64> {
        let entry = self.section(kind);
        let end = offset.checked_add(length as u64);
        if end.is_none_or(|end| end > entry.length) {
            return Err(IndexError::corrupted(
                self.source.name(),
                format!(
                    "read of {} bytes at {offset} is outside the {} section",
                    length,
                    kind.name()
                ),
            ));
        }
        if length > 0 {
            let first = offset / entry.chunk_bytes;
            let last = (offset + length as u64 - 1) / entry.chunk_bytes;
            for chunk in first..=last {
                self.verify_chunk(&entry, chunk)?;
            }
        }
        Ok(entry.offset + offset)
    }

    fn verify_chunk(&self, entry: &SectionEntry, chunk: u64) -> IndexResult<()> {
        let index = entry.first_chunk as usize + chunk as usize;
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        if self.verified_chunks[word].load(Ordering::Acquire) & bit != 0 {
            return Ok(());
        }
        let start = chunk * entry.chunk_bytes;
        let length = (entry.length - start).min(entry.chunk_bytes) as usize;
        let matches = || -> IndexResult<bool> {
            let bytes = self.source.read_at(entry.offset + start, length)?;
            Ok(self.checksums.chunk(index).matches(&bytes))
        };
        // A mismatch may be a transfer damaged on its way into a cache: the
        // source drops its copy and the chunk is read once more.
        if !matches()? {
            self.source.discard(entry.offset + start, length as u64);
            if !matches()? {
                return Err(IndexError::corrupted(
                    self.source.name(),
                    format!(
                        "checksum mismatch in {} section, chunk {chunk}",
                        entry.kind.name()
                    ),
                ));
            }
        }
        self.verified_chunks[word].fetch_or(bit, Ordering::AcqRel);
        Ok(())
    }

    /// Reads every section and checks its whole-section checksum.
    pub fn verify(&self) -> IndexResult<()> {
        for entry in &self.sections {
            self.source.read_ahead(entry.offset, entry.length as usize);
            let bytes = self.source.read_at(entry.offset, entry.length as usize)?;
            if crc32c::crc32c(&bytes) != entry.crc {
                return Err(IndexError::corrupted(
                    self.source.name(),
                    format!("{} section checksum mismatch", entry.kind.name()),
                ));
            }
        }
        Ok(())
    }

    /// Returns the id of `row`.
    pub fn id(&self, row: u32) -> IndexResult<PointId> {
        self.check_row(row)?;
        let object = self.source.name();
        match self.header.id_type {
            IdType::U64 => {
                let bytes = self.read(SectionKind::RowIds, row as u64 * 8, 8)?;
                Ok(PointId::U64(u64::from_le_bytes(
                    bytes[..8].try_into().expect("8 bytes"),
                )))
            }
            IdType::String => {
                let (at, length) = self.string_id_span(row)?;
                let bytes = self.read(SectionKind::RowIds, at, length)?;
                let text = std::str::from_utf8(&bytes)
                    .map_err(|_| IndexError::corrupted(object, "string id is not UTF-8"))?;
                Ok(PointId::String(text.to_string()))
            }
        }
    }

    /// Returns the id of every row, in row order, with one read of the row-id
    /// section (what an indexer needs to rebuild its primary-key map).
    pub fn ids(&self) -> IndexResult<Vec<PointId>> {
        let object = self.source.name();
        let rows = self.header.rows as usize;
        let bytes = self.read_section(SectionKind::RowIds)?;
        match self.header.id_type {
            IdType::U64 => {
                if bytes.len() < rows * 8 {
                    return Err(IndexError::corrupted(object, "row-id section is too short"));
                }
                Ok(bytes[..rows * 8]
                    .chunks_exact(8)
                    .map(|chunk| PointId::U64(u64::from_le_bytes(chunk.try_into().expect("8"))))
                    .collect())
            }
            IdType::String => {
                let base = (rows + 1) * 4;
                if bytes.len() < base {
                    return Err(IndexError::corrupted(object, "row-id section is too short"));
                }
                let offsets: Vec<usize> = bytes[..base]
                    .chunks_exact(4)
                    .map(|chunk| u32::from_le_bytes(chunk.try_into().expect("4")) as usize)
                    .collect();
                offsets
                    .windows(2)
                    .map(|pair| {
                        let (start, end) = (base + pair[0], base + pair[1]);
                        if end < start || end > bytes.len() {
                            return Err(IndexError::corrupted(
                                object,
                                "string id offsets are invalid",
                            ));
                        }
                        let text = std::str::from_utf8(&bytes[start..end])
                            .map_err(|_| IndexError::corrupted(object, "string id is not UTF-8"))?;
                        Ok(PointId::String(text.to_string()))
                    })
                    .collect()
            }
        }
    }

    /// Returns the row holding `id`, if this segment has it.
    pub fn row_of(&self, id: &PointId) -> IndexResult<Option<u32>> {
        let rows = self.header.rows;
        let (mut low, mut high) = (0u64, rows);
        while low < high {
            let middle = (low + high) / 2;
            let (candidate_id, row) = match self.header.id_type {
                IdType::U64 => {
                    let id_bytes = self.read(SectionKind::IdLookup, middle * 8, 8)?;
                    let row_bytes = self.read(SectionKind::IdLookup, rows * 8 + middle * 4, 4)?;
                    let row = u32::from_le_bytes(row_bytes[..4].try_into().expect("4 bytes"));
                    (
                        PointId::U64(u64::from_le_bytes(
                            id_bytes[..8].try_into().expect("8 bytes"),
                        )),
                        row,
                    )
                }
                IdType::String => {
                    let row_bytes = self.read(SectionKind::IdLookup, middle * 4, 4)?;
                    let row = u32::from_le_bytes(row_bytes[..4].try_into().expect("4 bytes"));
                    (self.id(row)?, row)
                }
            };
            match candidate_id.cmp(id) {
                std::cmp::Ordering::Equal => {
                    self.check_row(row)?;
                    return Ok(Some(row));
                }
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
            }
        }
        Ok(None)
    }

    /// Makes what a search answers of `rows` resident together before it is read
    /// hit by hit (see [`ByteSource::fetch_ahead`]): their ids, and as asked
    /// their payload offsets and raw vectors, then the payload (and string id)
    /// texts those offsets point at. A cold store is waited for twice at most,
    /// not once or twice per hit. Errors are left to the reads that follow.
    pub fn fetch_hits_ahead(&self, rows: &[u32], payloads: bool, vectors: bool) {
        Self::fetch_hits_ahead_together(&[(self, rows)], payloads, vectors);
    }

    /// [`Self::fetch_hits_ahead`] of the hits of several segments (`(segment,
    /// its rows)`) at once: the store is waited for twice at most in all, not
    /// twice per segment (see [`ByteSource::fetch_ahead_together`]).
    pub fn fetch_hits_ahead_together(hits: &[(&Self, &[u32])], payloads: bool, vectors: bool) {
        let mut ranges: Vec<Vec<(u64, usize)>> = hits
            .iter()
            .map(|&(segment, rows)| segment.hit_ranges(rows, payloads, vectors))
            .collect();
        fetch_together(hits.iter().map(|&(segment, _)| segment), &ranges);
        if !payloads
            && hits
                .iter()
                .all(|(segment, _)| segment.header.id_type != IdType::String)
        {
            return;
        }
        // The texts, where the offsets (now in) say.
        for (&(segment, rows), ranges) in hits.iter().zip(&mut ranges) {
            segment.hit_text_ranges(rows, payloads, ranges);
        }
        fetch_together(hits.iter().map(|&(segment, _)| segment), &ranges);
    }

    /// The ranges of `rows`' ids, and as asked their payload offsets and raw
    /// vectors (see [`Self::fetch_hits_ahead`]).
    fn hit_ranges(&self, rows: &[u32], payloads: bool, vectors: bool) -> Vec<(u64, usize)> {
        let ids = self.section(SectionKind::RowIds).offset;
        let stored = self.section(SectionKind::Payloads).offset;
        let raw = self.section(SectionKind::RawVectors).offset;
        let row_bytes = (self.header.dim * self.header.raw_precision.value_bytes()) as u64;
        let string_ids = self.header.id_type == IdType::String;
        let mut ranges = Vec::with_capacity(rows.len() * 3);
        for row in self.valid_rows(rows) {
            ranges.push(if string_ids {
                (ids + row * 4, 8)
            } else {
                (ids + row * 8, 8)
            });
            if payloads {
                ranges.push((stored + row * 8, 16));
            }
            if vectors {
                ranges.push((raw + row * row_bytes, row_bytes as usize));
            }
        }
        ranges
    }

    /// Sets `ranges` to where the payload texts (as asked) and string ids of
    /// `rows` lie, read from their offsets (see [`Self::fetch_hits_ahead`]).
    fn hit_text_ranges(&self, rows: &[u32], payloads: bool, ranges: &mut Vec<(u64, usize)>) {
        let ids = self.section(SectionKind::RowIds).offset;
        let stored = self.section(SectionKind::Payloads).offset;
        let string_ids = self.header.id_type == IdType::String;
        ranges.clear();
        for row in self.valid_rows(rows) {
            let row = row as u32;
            if payloads && let Ok(Some((at, length))) = self.payload_span(row) {
                ranges.push((stored + at, length));
            }
            if string_ids && let Ok((at, length)) = self.string_id_span(row) {
                ranges.push((ids + at, length));
            }
        }
    }

    /// The rows of `rows` this segment has.
    fn valid_rows<'r>(&self, rows: &'r [u32]) -> impl Iterator<Item = u64> + 'r {
        let count = self.header.rows;
        rows.iter()
            .map(|&row| row as u64)
            .filter(move |&row| row < count)
    }

    /// Returns where `row`'s payload text lies in the payload section (offset,
    /// length), `None` if it has none.
    fn payload_span(&self, row: u32) -> IndexResult<Option<(u64, usize)>> {
        let offsets = self.read(SectionKind::Payloads, row as u64 * 8, 16)?;
        let start = u64::from_le_bytes(offsets[..8].try_into().expect("8 bytes"));
        let end = u64::from_le_bytes(offsets[8..16].try_into().expect("8 bytes"));
        if end < start {
            return Err(IndexError::corrupted(
                self.source.name(),
                "payload offsets decrease",
            ));
        }
        let base = (self.header.rows + 1) * 8;
        Ok((end > start).then_some((base + start, (end - start) as usize)))
    }

    /// Returns where `row`'s string id text lies in the row-id section (offset,
    /// length).
    fn string_id_span(&self, row: u32) -> IndexResult<(u64, usize)> {
        let offsets = self.read(SectionKind::RowIds, row as u64 * 4, 8)?;
        let start = u32::from_le_bytes(offsets[..4].try_into().expect("4 bytes")) as u64;
        let end = u32::from_le_bytes(offsets[4..8].try_into().expect("4 bytes")) as u64;
        if end < start {
            return Err(IndexError::corrupted(
                self.source.name(),
                "string id offsets decrease",
            ));
        }
        let base = (self.header.rows + 1) * 4;
        Ok((base + start, (end - start) as usize))
    }

    /// Returns the stored payload of `row` as JSON bytes (`None` if it has none).
    pub fn payload_bytes(&self, row: u32) -> IndexResult<Option<Vec<u8>>> {
        self.check_row(row)?;
        let Some((at, length)) = self.payload_span(row)? else {
            return Ok(None);
        };
        let bytes = self.read(SectionKind::Payloads, at, length)?;
        Ok(Some(bytes.to_vec()))
    }

    /// Calls `visit(row, payload)` for every row that has a payload, in row
    /// order, with its stored JSON text. The section is read in windows of at
    /// most 4,096 rows and 4 MiB (a larger row alone), so a scan of a segment
    /// larger than memory or than the cache holds one window at a time.
    pub fn for_each_payload(
        &self,
        mut visit: impl FnMut(u32, &[u8]) -> IndexResult<()>,
    ) -> IndexResult<()> {
        let rows = self.header.rows;
        let base = (rows + 1) * 8;
        let mut first = 0u64;
        while first < rows {
            let count = (rows - first).min(PAYLOAD_SCAN_ROWS);
            let offset_bytes =
                self.read(SectionKind::Payloads, first * 8, (count as usize + 1) * 8)?;
            let offsets: Vec<u64> = offset_bytes
                .chunks_exact(8)
                .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
                .collect();
            drop(offset_bytes);
            if offsets.windows(2).any(|pair| pair[1] < pair[0]) {
                return Err(IndexError::corrupted(
                    self.source.name(),
                    "payload offsets decrease",
                ));
            }
            // Rows whose texts together fit a window are read in one piece.
            let mut start = 0usize;
            while start < count as usize {
                let mut end = start + 1;
                while end < count as usize
                    && offsets[end + 1] - offsets[start] <= PAYLOAD_SCAN_BYTES
                {
                    end += 1;
                }
                let span = (offsets[end] - offsets[start]) as usize;
                if span > 0 {
                    let bytes = self.read(SectionKind::Payloads, base + offsets[start], span)?;
                    for index in start..end {
                        let from = (offsets[index] - offsets[start]) as usize;
                        let to = (offsets[index + 1] - offsets[start]) as usize;
                        if to > from {
                            visit((first + index as u64) as u32, &bytes[from..to])?;
                        }
                    }
                }
                start = end;
            }
            first += count;
        }
        Ok(())
    }

    /// Returns the stored payload of `row` parsed as JSON.
    pub fn payload(&self, row: u32) -> IndexResult<Option<serde_json::Value>> {
        match self.payload_bytes(row)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|_| {
                IndexError::corrupted(
                    self.source.name(),
                    format!("payload of row {row} is not JSON"),
                )
            }),
        }
    }

    /// Returns the stored full vector of `row` (normalised for cosine).
    pub fn vector(&self, row: u32) -> IndexResult<Vec<f32>> {
        self.check_row(row)?;
        let dim = self.header.dim;
        let value_bytes = self.header.raw_precision.value_bytes();
        let bytes = self.read(
            SectionKind::RawVectors,
            row as u64 * (dim * value_bytes) as u64,
            dim * value_bytes,
        )?;
        Ok(match self.header.raw_precision {
            RawPrecision::F32 => cast::<f32>(self.source.name(), "raw vector", &bytes)?.to_vec(),
            RawPrecision::Bf16 => cast::<u16>(self.source.name(), "raw vector", &bytes)?
                .iter()
                .map(|&bits| quiver_simd::bf16_bits_to_f32(bits))
                .collect(),
        })
    }

    /// Returns the decoded column of filterable field `name`, if the segment has it.
    pub fn field_column(&self, name: &str) -> IndexResult<Option<FieldColumn>> {
        let bytes = self.read_section(SectionKind::Fields)?;
        fields::decode_column(self.source.name(), &bytes, name, self.header.rows as usize)
    }

    pub(crate) fn check_row(&self, row: u32) -> IndexResult<()> {
        if row as u64 >= self.header.rows {
            return Err(IndexError::InvalidArgument(format!(
                "row {row} is outside segment {} of {} rows",
                self.source.name(),
                self.header.rows
            )));
        }
        Ok(())
    }

    pub(crate) fn cast<'b, T: bytemuck::Pod>(
        &self,
        what: &str,
        bytes: &'b [u8],
    ) -> IndexResult<&'b [T]> {
        cast(self.source.name(), what, bytes)
    }
}

fn validate_header(object: &str, header: &SegmentHeader) -> IndexResult<()> {
    let bad = |reason: String| Err(IndexError::corrupted(object, format!("header: {reason}")));
    if !(format::OLDEST_FORMAT_VERSION..=format::FORMAT_VERSION).contains(&header.format_version) {
        return Err(IndexError::UnsupportedVersion {
            object: object.to_string(),
            found: header.format_version,
            supported: format::FORMAT_VERSION,
        });
    }
    if header.dim == 0 || header.padded_dim != padded_dimension(header.dim) {
        return bad(format!(
            "dimension {} / padded {} is invalid",
            header.dim, header.padded_dim
        ));
    }
    if header.rows == 0 || header.rows > u32::MAX as u64 {
        return bad(format!("row count {} is invalid", header.rows));
    }
    // A segment built with a shard codebook may have more lists than rows
    // (most empty); no codebook has more lists than the rows it was trained on.
    let most_lists = header.codebook.map_or(header.rows, |codebook| {
        codebook.trained_rows.max(header.rows)
    });
    if header.nlist == 0 || header.nlist as u64 > most_lists {
        return bad(format!("list count {} is invalid", header.nlist));
    }
    if header.block_rows != quiver_simd::RABITQ_BLOCK_ROWS
        || header.query_bits != quiver_simd::RABITQ_QUERY_BITS
    {
        return bad("code layout is not the one this build reads".into());
    }
    Ok(())
}

/// Fetches ahead the ranges `ranges[i]` of the `i`-th of `segments`, all
/// together (see [`ByteSource::fetch_ahead_together`]), when there are two
/// ranges or more in all (one is left to its read).
pub(crate) fn fetch_together<'s, S: ByteSource + 's>(
    segments: impl Iterator<Item = &'s Segment<S>>,
    ranges: &[Vec<(u64, usize)>],
) {
    if ranges.iter().map(Vec::len).sum::<usize>() < 2 {
        return;
    }
    let requests: Vec<(&S, &[(u64, usize)])> = segments
        .zip(ranges)
        .filter(|(_, ranges)| !ranges.is_empty())
        .map(|(segment, ranges)| (&segment.source, ranges.as_slice()))
        .collect();
    S::fetch_ahead_together(&requests);
}
