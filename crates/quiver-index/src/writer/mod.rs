//! Segment writer: trains the IVF lists (or assigns rows to a shared
//! codebook's), encodes RaBitQ codes and writes the segment file (format v2) to
//! any `std::io::Write` (the caller decides where bytes go). `validate`: the
//! checks a point passes before it is added; `rows`: the rows kept in memory or
//! in scratch files; `sections`: the section writers.

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use quiver_simd::RABITQ_BLOCK_ROWS;

mod rows;
mod sections;
mod validate;

pub use self::validate::{
    MAX_SQUARED_LENGTH, normalize_into, normalized, validate_id, validate_point, validate_query,
    validate_vector,
};

use self::rows::{FrozenRows, RowStore};

use self::sections::{
    IdLookup, SectionSink, SectionWriter, build_id_lookup, write_codes, write_id_lookup, write_ids,
};
use crate::build_pool::build_pool;
use crate::codebook::{Codebook, CodebookInfo, codebook_id};
use crate::error::{IndexError, IndexResult};
use crate::fields::{self, FieldSpec, FieldValue};
use crate::format::{self, SectionKind};
use crate::kmeans;
use crate::params::{BuildParams, IdType, Metric, RawPrecision, default_nlist};
use crate::rabitq::{self, FACTOR_BLOCK_BYTES, RowFactors};
use crate::rotation::{Rotation, padded_dimension};

pub use quiver_model::PointId;

/// What every segment of a collection shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentSpec {
    /// Vector dimension.
    pub dim: usize,
    /// Similarity measure.
    pub metric: Metric,
    /// Kind of point ids.
    pub id_type: IdType,
    /// Filterable payload fields.
    pub fields: Vec<FieldSpec>,
    /// How the index is built.
    pub build: BuildParams,
    /// Opaque collection parameters recorded in the header.
    pub collection: serde_json::Value,
}

impl SegmentSpec {
    /// Returns a spec with default build parameters and no fields.
    pub fn new(dim: usize, metric: Metric, id_type: IdType) -> Self {
        SegmentSpec {
            dim,
            metric,
            id_type,
            fields: Vec::new(),
            build: BuildParams::default(),
            collection: serde_json::Value::Null,
        }
    }
}

/// The JSON header section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentHeader {
    /// Format version of the file.
    pub format_version: u32,
    /// Vector dimension.
    pub dim: usize,
    /// Dimension of rotated vectors and codes (multiple of 64).
    pub padded_dim: usize,
    /// Similarity measure.
    pub metric: Metric,
    /// Kind of point ids.
    pub id_type: IdType,
    /// Number of rows.
    pub rows: u64,
    /// Number of IVF lists.
    pub nlist: usize,
    /// Number of 32-row code blocks.
    pub blocks: usize,
    /// Precision of the stored full vectors.
    pub raw_precision: RawPrecision,
    /// Seed of the RaBitQ rotation.
    pub rotation_seed: u64,
    /// Bits per dimension of the quantized query.
    pub query_bits: usize,
    /// Rows per code block.
    pub block_rows: usize,
    /// Filterable fields with columns in this segment.
    pub fields: Vec<FieldSpec>,
    /// Opaque collection parameters.
    pub collection: serde_json::Value,
    /// The codebook (centroids and rotation) the lists were built with;
    /// absent in segments written before codebooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codebook: Option<CodebookInfo>,
}

/// Numbers about a written segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentSummary {
    /// Rows written.
    pub rows: u64,
    /// IVF lists.
    pub nlist: usize,
    /// Total file size.
    pub file_bytes: u64,
    /// Bytes that must stay hot for fast search: centroids, directory, codes, factors.
    pub hot_bytes: u64,
    /// Bytes of the stored full vectors.
    pub raw_bytes: u64,
}

/// Steps of a build, reported to a progress callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildStage {
    /// k-means training and assignment (done/total = iterations).
    Clustering,
    /// RaBitQ encoding (done/total = lists).
    Encoding,
    /// Writing sections (done/total = sections).
    Writing,
}

/// Progress callback: `(stage, done, total)`.
pub type BuildProgress<'a> = &'a (dyn Fn(BuildStage, u64, u64) + Sync);

/// Collects rows and writes them as one segment.
///
/// A writer made with [`SegmentWriter::new`] holds the rows' vectors and
/// payloads in memory until [`finish`](Self::finish); one made with
/// [`SegmentWriter::with_scratch_dir`] appends them to unnamed scratch files
/// and maps them back to build, so its memory is a few bytes per row (ids,
/// list assignments, codes) plus the k-means sample, whatever the rows' size.
pub struct SegmentWriter {
    spec: SegmentSpec,
    ids: Vec<PointId>,
    rows: RowStore,
    field_values: Vec<Vec<Option<FieldValue>>>,
    /// Set when a scratch write failed mid-row: the writer cannot build.
    broken: Option<String>,
}

impl SegmentWriter {
    /// Returns an empty writer for segments of `spec`, holding rows in memory.
    pub fn new(spec: SegmentSpec) -> IndexResult<Self> {
        Self::with_rows(spec, || Ok(RowStore::in_memory()))
    }

    /// Returns an empty writer for segments of `spec` that keeps the rows'
    /// vectors and payloads in scratch files in `directory` (removed when the
    /// writer is done, also when it fails or the process dies).
    pub fn with_scratch_dir(spec: SegmentSpec, directory: &Path) -> IndexResult<Self> {
        Self::with_rows(spec, || RowStore::spilled(directory))
    }

    fn with_rows(
        spec: SegmentSpec,
        rows: impl FnOnce() -> IndexResult<RowStore>,
    ) -> IndexResult<Self> {
        if spec.dim == 0 || spec.dim > 65_536 {
            return Err(IndexError::InvalidArgument(format!(
                "dimension {} is outside 1..=65536",
                spec.dim
            )));
        }
        let mut names: Vec<&str> = spec.fields.iter().map(|f| f.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(IndexError::InvalidArgument(
                "payload schema declares a field twice".into(),
            ));
        }
        Ok(SegmentWriter {
            spec,
            ids: Vec::new(),
            rows: rows()?,
            field_values: Vec::new(),
            broken: None,
        })
    }

    /// Returns the number of rows added so far.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Returns true when no row was added.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Adds one row. Nothing is added when the row is invalid; when writing
    /// a scratch file fails, the error is returned and the writer can no
    /// longer build.
    pub fn add(
        &mut self,
        id: PointId,
        vector: &[f32],
        payload: Option<&serde_json::Value>,
    ) -> IndexResult<()> {
        if let Some(reason) = &self.broken {
            return Err(IndexError::InvalidArgument(format!(
                "the segment writer failed earlier: {reason}"
            )));
        }
        let row = self.ids.len();
        validate::check_point(&self.spec, row, &id, vector, payload, false)?;
        let values = fields::extract_values(&self.spec.fields, row, payload)?;
        let payload = payload.map(|p| serde_json::to_vec(p).expect("JSON value serialises"));
        let pushed = if self.spec.metric == Metric::Cosine {
            self.rows.push(&normalized(vector), payload.as_deref())
        } else {
            self.rows.push(vector, payload.as_deref())
        };
        if let Err(error) = pushed {
            self.broken = Some(error.to_string());
            return Err(error);
        }
        self.ids.push(id);
        self.field_values.push(values);
        Ok(())
    }

    /// Builds the index and writes the segment to `out`.
    ///
    /// The steps: cluster the rows into IVF lists, lay the lists out (rows
    /// sorted by list, in blocks), rotate the centroids, encode every row's
    /// RaBitQ code and factors, then write the sections.
    pub fn finish(
        mut self,
        out: &mut dyn Write,
        progress: BuildProgress<'_>,
    ) -> IndexResult<SegmentSummary> {
        let rows = self.ids.len();
        if rows == 0 {
            return Err(IndexError::InvalidArgument(
                "a segment needs at least one row".into(),
            ));
        }
        if let Some(reason) = self.broken.take() {
            return Err(IndexError::InvalidArgument(format!(
                "the segment writer failed earlier: {reason}"
            )));
        }
        let frozen = std::mem::replace(&mut self.rows, RowStore::in_memory()).freeze()?;
        self.build(&frozen, out, progress)
    }

    /// The build proper, over the frozen rows.
    fn build(
        &self,
        frozen: &FrozenRows,
        out: &mut dyn Write,
        progress: BuildProgress<'_>,
    ) -> IndexResult<SegmentSummary> {
        let rows = self.ids.len();
        let vectors = frozen.vectors();
        let build = &self.spec.build;
        let id_lookup = build_id_lookup(&self.ids)?;
        let pool = build_pool(build.threads)?;
        let (layout, rotation, rotated_centroids, codebook) = match &build.codebook {
            Some(codebook) => {
                codebook.check_dim(self.spec.dim)?;
                let rotation = Rotation::new(self.spec.dim, codebook.seed());
                let assignments =
                    self.assign_to_codebook(&pool, vectors, &rotation, codebook, progress);
                let layout = ListLayout::new(&assignments, codebook.nlist())?;
                let centroids = codebook.rotated_centroids().to_vec();
                (layout, rotation, centroids, codebook.info())
            }
            None => {
                let nlist = build
                    .nlist
                    .unwrap_or_else(|| default_nlist(rows))
                    .clamp(1, rows);
                let clustering = self.cluster(&pool, vectors, nlist, progress);
                let layout = ListLayout::new(&clustering.assignments, nlist)?;
                let rotation = Rotation::new(self.spec.dim, build.seed);
                let centroids = rotate_centroids(&rotation, &clustering.centroids, self.spec.dim);
                let info = CodebookInfo {
                    id: codebook_id(build.seed, self.spec.dim, &centroids),
                    trained_rows: rows as u64,
                };
                (layout, rotation, centroids, info)
            }
        };
        let encoded = self.encode_lists(
            &pool,
            vectors,
            &layout,
            &rotation,
            &rotated_centroids,
            progress,
        );
        let lists = Lists {
            layout,
            rotated_centroids,
            codebook,
        };
        self.write_sections(out, frozen, &lists, &encoded, &id_lookup, progress)
    }

    /// Assigns every row to its nearest centroid of `codebook` (no training;
    /// for dot the one nearest its direction, as a trained build): rows are
    /// rotated into the centroids' space a tile at a time (the rotation keeps
    /// distances and norms, so the nearest centroid is the same).
    fn assign_to_codebook(
        &self,
        pool: &rayon::ThreadPool,
        vectors: &[f32],
        rotation: &Rotation,
        codebook: &Codebook,
        progress: BuildProgress<'_>,
    ) -> Vec<u32> {
        const TILE_ROWS: usize = 1024;
        let dim = self.spec.dim;
        let padded_dim = padded_dimension(dim);
        let rows = self.ids.len();
        let mut assignments = vec![0u32; rows];
        let centroids = kmeans::Geometry::of(self.spec.metric)
            .matching(codebook.rotated_centroids(), padded_dim);
        pool.install(|| {
            assignments
                .par_chunks_mut(TILE_ROWS)
                .enumerate()
                .for_each(|(tile, slots)| {
                    let first = tile * TILE_ROWS;
                    let mut rotated = vec![0f32; slots.len() * padded_dim];
                    for (offset, out) in rotated.chunks_exact_mut(padded_dim).enumerate() {
                        let row = first + offset;
                        rotation.apply(&vectors[row * dim..][..dim], out);
                    }
                    kmeans::assign(&rotated, padded_dim, &centroids, slots);
                });
        });
        progress(BuildStage::Clustering, 1, 1);
        assignments
    }

    /// Trains `nlist` k-means centroids and assigns every row to its nearest
    /// (for dot: the one nearest its direction, see [`kmeans::Geometry`]).
    fn cluster(
        &self,
        pool: &rayon::ThreadPool,
        vectors: &[f32],
        nlist: usize,
        progress: BuildProgress<'_>,
    ) -> kmeans::Clustering {
        let build = &self.spec.build;
        pool.install(|| {
            kmeans::train_and_assign(
                vectors,
                self.spec.dim,
                nlist,
                build.kmeans_iterations,
                build.kmeans_sample_per_list,
                build.seed,
                kmeans::Geometry::of(self.spec.metric),
                &|done, total| progress(BuildStage::Clustering, done, total),
            )
        })
    }

    /// Encodes every row's RaBitQ code (bit-transposed per block) and factors,
    /// one list per task, each task writing its own disjoint slices.
    fn encode_lists(
        &self,
        pool: &rayon::ThreadPool,
        vectors: &[f32],
        layout: &ListLayout,
        rotation: &Rotation,
        rotated_centroids: &[f32],
        progress: BuildProgress<'_>,
    ) -> EncodedLists {
        let dim = self.spec.dim;
        let padded_dim = padded_dimension(dim);
        let words = padded_dim / 64;
        let nlist = layout.directory.len();
        let mut codes = vec![0u64; layout.blocks * words * RABITQ_BLOCK_ROWS];
        let mut factors = vec![0f32; layout.blocks * FACTOR_BLOCK_BYTES / 4];
        let encoded_lists = std::sync::atomic::AtomicU64::new(0);
        // Hand each list its own disjoint slices of the code and factor arrays.
        let mut list_jobs = Vec::with_capacity(nlist);
        let (mut codes_rest, mut factors_rest) = (codes.as_mut_slice(), factors.as_mut_slice());
        for (list, entry) in layout.directory.iter().enumerate() {
            let list_blocks = (entry[1] as usize).div_ceil(RABITQ_BLOCK_ROWS);
            let (list_codes, codes_tail) =
                codes_rest.split_at_mut(list_blocks * words * RABITQ_BLOCK_ROWS);
            let (list_factors, factors_tail) =
                factors_rest.split_at_mut(list_blocks * FACTOR_BLOCK_BYTES / 4);
            codes_rest = codes_tail;
            factors_rest = factors_tail;
            list_jobs.push((list, list_codes, list_factors));
        }
        pool.install(|| {
            list_jobs
                .into_par_iter()
                .for_each(|(list, list_codes, list_factors)| {
                    let [row_start, size, _] = layout.directory[list];
                    let centroid = &rotated_centroids[list * padded_dim..][..padded_dim];
                    let mut rotated = vec![0f32; padded_dim];
                    let mut word_buffer = vec![0u64; words];
                    for position in 0..size as usize {
                        let input = layout.order[row_start as usize + position] as usize;
                        rotation.apply(&vectors[input * dim..][..dim], &mut rotated);
                        for (value, c) in rotated.iter_mut().zip(centroid) {
                            *value -= c;
                        }
                        let row_factors: RowFactors = rabitq::encode_row(
                            &rotated,
                            centroid,
                            self.spec.metric,
                            &mut word_buffer,
                        );
                        let (block, lane) =
                            (position / RABITQ_BLOCK_ROWS, position % RABITQ_BLOCK_ROWS);
                        let block_codes = &mut list_codes[block * words * RABITQ_BLOCK_ROWS..];
                        for (word, &bits) in word_buffer.iter().enumerate() {
                            block_codes[word * RABITQ_BLOCK_ROWS + lane] = bits;
                        }
                        let block_factors = &mut list_factors[block * FACTOR_BLOCK_BYTES / 4..];
                        block_factors[lane] = row_factors.constant;
                        block_factors[RABITQ_BLOCK_ROWS + lane] = row_factors.rescale;
                        block_factors[2 * RABITQ_BLOCK_ROWS + lane] = row_factors.error;
                        block_factors[3 * RABITQ_BLOCK_ROWS + lane] = row_factors.popcount2;
                    }
                    let done = encoded_lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if done.is_multiple_of(64) || done == nlist as u64 {
                        progress(BuildStage::Encoding, done, nlist as u64);
                    }
                });
        });
        EncodedLists { codes, factors }
    }

    /// Returns the header section's contents.
    fn header(&self, layout: &ListLayout, codebook: CodebookInfo) -> SegmentHeader {
        let spec = &self.spec;
        SegmentHeader {
            format_version: format::FORMAT_VERSION,
            dim: spec.dim,
            padded_dim: padded_dimension(spec.dim),
            metric: spec.metric,
            id_type: spec.id_type,
            rows: self.ids.len() as u64,
            nlist: layout.directory.len(),
            blocks: layout.blocks,
            raw_precision: spec.build.raw_precision,
            rotation_seed: spec.build.seed,
            query_bits: quiver_simd::RABITQ_QUERY_BITS,
            block_rows: RABITQ_BLOCK_ROWS,
            fields: spec.fields.clone(),
            collection: spec.collection.clone(),
            codebook: Some(codebook),
        }
    }

    /// Writes every section, in [`SectionKind::ALL`] order, and the table.
    fn write_sections(
        &self,
        out: &mut dyn Write,
        frozen: &FrozenRows,
        lists: &Lists,
        encoded: &EncodedLists,
        id_lookup: &IdLookup,
        progress: BuildProgress<'_>,
    ) -> IndexResult<SegmentSummary> {
        let (layout, rotated_centroids) = (&lists.layout, lists.rotated_centroids.as_slice());
        let total_sections = SectionKind::ALL.len() as u64;
        let mut file = SectionWriter::new(out);
        let mut step = 0u64;
        let mut advance = || {
            step += 1;
            progress(BuildStage::Writing, step, total_sections);
        };
        let header = self.header(layout, lists.codebook);
        file.section(SectionKind::Header, |w| {
            w.write(&serde_json::to_vec(&header).expect("header"))
        })?;
        advance();
        file.section(SectionKind::Centroids, |w| {
            w.write(bytemuck::cast_slice(rotated_centroids))
        })?;
        advance();
        file.section(SectionKind::ClusterDirectory, |w| {
            w.write(bytemuck::cast_slice(&layout.directory))
        })?;
        advance();
        file.section(SectionKind::Codes, |w| {
            write_codes(w, layout, encoded, header.padded_dim / 64)
        })?;
        advance();
        file.section(SectionKind::RowIds, |w| {
            write_ids(w, &self.ids, &layout.order)
        })?;
        advance();
        file.section(SectionKind::RawVectors, |w| {
            self.write_raw_vectors(w, frozen.vectors(), &layout.order)
        })?;
        advance();
        file.section(SectionKind::Payloads, |w| {
            write_payloads(w, frozen, &layout.order)
        })?;
        advance();
        let ordered_values: Vec<Vec<Option<FieldValue>>> = layout
            .order
            .iter()
            .map(|&input| self.field_values[input as usize].clone())
            .collect();
        file.section(SectionKind::Fields, |w| {
            w.write(&fields::encode_columns(&self.spec.fields, &ordered_values))
        })?;
        advance();
        file.section(SectionKind::IdLookup, |w| {
            write_id_lookup(w, id_lookup, &layout.order)
        })?;
        advance();
        let summary_hot = [
            SectionKind::Centroids,
            SectionKind::ClusterDirectory,
            SectionKind::Codes,
        ];
        let hot_bytes: u64 = file
            .entries
            .iter()
            .filter(|entry| summary_hot.contains(&entry.kind))
            .map(|entry| entry.length)
            .sum();
        let raw_bytes = file
            .entries
            .iter()
            .find(|e| e.kind == SectionKind::RawVectors)
            .map_or(0, |e| e.length);
        let file_bytes = file.finish()?;
        advance();
        Ok(SegmentSummary {
            rows: self.ids.len() as u64,
            nlist: layout.directory.len(),
            file_bytes,
            hot_bytes,
            raw_bytes,
        })
    }

    /// Writes the full vectors in segment row order, at the build's precision.
    fn write_raw_vectors(
        &self,
        w: &mut SectionSink<'_, '_>,
        vectors: &[f32],
        order: &[u32],
    ) -> IndexResult<()> {
        let dim = self.spec.dim;
        let mut row_buffer: Vec<u16> = Vec::with_capacity(dim);
        for &input in order {
            let vector = &vectors[input as usize * dim..][..dim];
            match self.spec.build.raw_precision {
                RawPrecision::F32 => w.write(bytemuck::cast_slice(vector))?,
                RawPrecision::Bf16 => {
                    row_buffer.clear();
                    row_buffer.extend(vector.iter().map(|&v| quiver_simd::f32_to_bf16_bits(v)));
                    w.write(bytemuck::cast_slice(&row_buffer))?;
                }
            }
        }
        Ok(())
    }
}

/// Writes `rows + 1` payload end offsets, then the payloads, in row order.
fn write_payloads(
    w: &mut SectionSink<'_, '_>,
    frozen: &FrozenRows,
    order: &[u32],
) -> IndexResult<()> {
    let mut offset = 0u64;
    w.write(&offset.to_le_bytes())?;
    for &input in order {
        offset += frozen.payload(input as usize).len() as u64;
        w.write(&offset.to_le_bytes())?;
    }
    for &input in order {
        w.write(frozen.payload(input as usize))?;
    }
    Ok(())
}

/// Where the lists go: rows sorted by list (row r of the segment is input row
/// `order[r]`) and, per list, `[first row, rows, first block]`.
struct ListLayout {
    order: Vec<u32>,
    directory: Vec<[u32; 3]>,
    blocks: usize,
}

impl ListLayout {
    /// Fails (instead of indexing out of bounds) when a row was assigned to
    /// no list of `nlist`: k-means always assigns one, so this is a bug, but a
    /// build error names it where a panic would stop the shard's flushes.
    fn new(assignments: &[u32], nlist: usize) -> IndexResult<Self> {
        if let Some(row) = assignments.iter().position(|&list| list as usize >= nlist) {
            return Err(IndexError::InvalidArgument(format!(
                "segment build: row {row} was assigned to list {} of {nlist} (its distances to \
                 the centroids are not finite?)",
                assignments[row]
            )));
        }
        let mut order: Vec<u32> = (0..assignments.len() as u32).collect();
        order.sort_by_key(|&input| assignments[input as usize]);
        let mut list_sizes = vec![0u32; nlist];
        for &list in assignments {
            list_sizes[list as usize] += 1;
        }
        let mut directory = Vec::with_capacity(nlist);
        let (mut row_start, mut block_start) = (0u32, 0u32);
        for &size in &list_sizes {
            directory.push([row_start, size, block_start]);
            row_start += size;
            block_start += size.div_ceil(RABITQ_BLOCK_ROWS as u32);
        }
        Ok(ListLayout {
            order,
            directory,
            blocks: block_start as usize,
        })
    }
}

/// The lists of a build: where rows go, the rotated centroids, and the
/// codebook they come from.
struct Lists {
    layout: ListLayout,
    rotated_centroids: Vec<f32>,
    codebook: CodebookInfo,
}

/// Every row's RaBitQ code words and factors, block by block.
struct EncodedLists {
    codes: Vec<u64>,
    factors: Vec<f32>,
}

/// Returns the centroids rotated into the padded space the codes live in.
fn rotate_centroids(rotation: &Rotation, centroids: &[f32], dim: usize) -> Vec<f32> {
    let padded_dim = padded_dimension(dim);
    let nlist = centroids.len() / dim;
    let mut rotated_centroids = vec![0f32; nlist * padded_dim];
    for (centroid, rotated) in centroids
        .chunks_exact(dim)
        .zip(rotated_centroids.chunks_exact_mut(padded_dim))
    {
        rotation.apply(centroid, rotated);
    }
    rotated_centroids
}
