//! Segment writer: trains the IVF lists, encodes RaBitQ codes and writes the
//! segment file v1 to any `std::io::Write` (the caller decides where bytes go).

use std::io::Write;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use quiver_simd::RABITQ_BLOCK_ROWS;

use crate::error::{IndexError, IndexResult};
use crate::fields::{self, FieldSpec, FieldValue};
use crate::format::{self, CHUNK_BYTES, SECTION_ALIGN, SectionEntry, SectionKind};
use crate::kmeans;
use crate::params::{
    BuildParams, IdType, MAX_STRING_ID_BYTES, Metric, RawPrecision, default_nlist,
};
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
pub struct SegmentWriter {
    spec: SegmentSpec,
    ids: Vec<PointId>,
    vectors: Vec<f32>,
    payloads: Vec<Option<Vec<u8>>>,
    field_values: Vec<Vec<Option<FieldValue>>>,
}

/// Checks a vector: right dimension, finite values (and non-zero for cosine).
pub fn validate_vector(row: usize, vector: &[f32], dim: usize, metric: Metric) -> IndexResult<()> {
    if vector.len() != dim {
        return Err(IndexError::DimensionMismatch {
            row,
            expected: dim,
            actual: vector.len(),
        });
    }
    if let Some(position) = vector.iter().position(|v| !v.is_finite()) {
        return Err(IndexError::NonFinite {
            row,
            position,
            value: vector[position],
        });
    }
    if metric == Metric::Cosine && vector.iter().all(|&v| v == 0.0) {
        return Err(IndexError::InvalidArgument(format!(
            "vector for row {row} is all zeros, which has no cosine similarity"
        )));
    }
    Ok(())
}

/// Checks an id against `spec`: of the collection's type, and a string id
/// 1..=128 bytes long. `row` only numbers the id in messages.
pub fn validate_id(spec: &SegmentSpec, row: usize, id: &PointId) -> IndexResult<()> {
    match (id, spec.id_type) {
        (PointId::U64(_), IdType::U64) => Ok(()),
        (PointId::String(text), IdType::String) => {
            if text.is_empty() || text.len() > MAX_STRING_ID_BYTES {
                return Err(IndexError::InvalidArgument(format!(
                    "string id of row {row} has {} bytes, expected 1..={MAX_STRING_ID_BYTES}",
                    text.len()
                )));
            }
            Ok(())
        }
        (PointId::String(_), IdType::U64) => Err(IndexError::InvalidArgument(format!(
            "id {id} of row {row} is a string, but the collection's ids are unsigned integers"
        ))),
        (PointId::U64(_), IdType::String) => Err(IndexError::InvalidArgument(format!(
            "id {id} of row {row} is a number, but the collection's ids are strings"
        ))),
    }
}

/// Checks one point against `spec` the way [`SegmentWriter::add`] will: id of the
/// collection's type (string ids 1..=128 bytes), vector of the right dimension with
/// finite values (non-zero for cosine), payload a JSON object whose schema fields
/// have the declared types. `row` only numbers the point in messages.
pub fn validate_point(
    spec: &SegmentSpec,
    row: usize,
    id: &PointId,
    vector: &[f32],
    payload: Option<&serde_json::Value>,
) -> IndexResult<()> {
    validate_id(spec, row, id)?;
    validate_vector(row, vector, spec.dim, spec.metric)?;
    if let Some(payload) = payload.filter(|payload| !payload.is_object()) {
        let kind = match payload {
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::Object(_) => "an object",
        };
        return Err(IndexError::InvalidArgument(format!(
            "payload of row {row} must be a JSON object, got {kind}"
        )));
    }
    fields::extract_values(&spec.fields, row, payload)?;
    Ok(())
}

impl SegmentWriter {
    /// Returns an empty writer for segments of `spec`.
    pub fn new(spec: SegmentSpec) -> IndexResult<Self> {
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
            vectors: Vec::new(),
            payloads: Vec::new(),
            field_values: Vec::new(),
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

    /// Adds one row. Nothing is added when the row is invalid.
    pub fn add(
        &mut self,
        id: PointId,
        vector: &[f32],
        payload: Option<&serde_json::Value>,
    ) -> IndexResult<()> {
        let row = self.ids.len();
        validate_point(&self.spec, row, &id, vector, payload)?;
        let values = fields::extract_values(&self.spec.fields, row, payload)?;
        self.ids.push(id);
        if self.spec.metric == Metric::Cosine {
            let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
            self.vectors.extend(vector.iter().map(|v| v / norm));
        } else {
            self.vectors.extend_from_slice(vector);
        }
        self.payloads
            .push(payload.map(|p| serde_json::to_vec(p).expect("JSON value serialises")));
        self.field_values.push(values);
        Ok(())
    }

    /// Builds the index and writes the segment to `out`.
    pub fn finish(
        self,
        out: &mut dyn Write,
        progress: BuildProgress<'_>,
    ) -> IndexResult<SegmentSummary> {
        let rows = self.ids.len();
        if rows == 0 {
            return Err(IndexError::InvalidArgument(
                "a segment needs at least one row".into(),
            ));
        }
        let spec = &self.spec;
        let dim = spec.dim;
        let build = &spec.build;
        let nlist = build
            .nlist
            .unwrap_or_else(|| default_nlist(rows))
            .clamp(1, rows);
        let id_lookup = build_id_lookup(&self.ids)?;

        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(build.threads)
            .build()
            .map_err(|error| IndexError::InvalidArgument(format!("thread pool: {error}")))?;
        let clustering = pool.install(|| {
            kmeans::train_and_assign(
                &self.vectors,
                dim,
                nlist,
                build.kmeans_iterations,
                build.kmeans_sample_per_list,
                build.seed,
                &|done, total| progress(BuildStage::Clustering, done, total),
            )
        });

        // Rows sorted by list: row r of the segment is input row `order[r]`.
        let mut order: Vec<u32> = (0..rows as u32).collect();
        order.sort_by_key(|&input| clustering.assignments[input as usize]);
        let mut list_sizes = vec![0u32; nlist];
        for &list in &clustering.assignments {
            list_sizes[list as usize] += 1;
        }
        let mut directory = Vec::with_capacity(nlist);
        let (mut row_start, mut block_start) = (0u32, 0u32);
        for &size in &list_sizes {
            directory.push([row_start, size, block_start]);
            row_start += size;
            block_start += size.div_ceil(RABITQ_BLOCK_ROWS as u32);
        }
        let blocks = block_start as usize;

        let rotation = Rotation::new(dim, build.seed);
        let padded_dim = padded_dimension(dim);
        let words = padded_dim / 64;
        let mut rotated_centroids = vec![0f32; nlist * padded_dim];
        for (centroid, rotated) in clustering
            .centroids
            .chunks_exact(dim)
            .zip(rotated_centroids.chunks_exact_mut(padded_dim))
        {
            rotation.apply(centroid, rotated);
        }

        let mut codes = vec![0u64; blocks * words * RABITQ_BLOCK_ROWS];
        let mut factors = vec![0f32; blocks * FACTOR_BLOCK_BYTES / 4];
        let encoded_lists = std::sync::atomic::AtomicU64::new(0);
        {
            // Hand each list its own disjoint slices of the code and factor arrays.
            let mut list_jobs = Vec::with_capacity(nlist);
            let (mut codes_rest, mut factors_rest) = (codes.as_mut_slice(), factors.as_mut_slice());
            for (list, entry) in directory.iter().enumerate() {
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
                        let [row_start, size, _] = directory[list];
                        let centroid = &rotated_centroids[list * padded_dim..][..padded_dim];
                        let mut rotated = vec![0f32; padded_dim];
                        let mut word_buffer = vec![0u64; words];
                        for position in 0..size as usize {
                            let input = order[row_start as usize + position] as usize;
                            rotation.apply(&self.vectors[input * dim..][..dim], &mut rotated);
                            for (value, c) in rotated.iter_mut().zip(centroid) {
                                *value -= c;
                            }
                            let row_factors: RowFactors = rabitq::encode_row(
                                &rotated,
                                centroid,
                                spec.metric,
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
                        let done =
                            encoded_lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        if done.is_multiple_of(64) || done == nlist as u64 {
                            progress(BuildStage::Encoding, done, nlist as u64);
                        }
                    });
            });
        }

        let header = SegmentHeader {
            format_version: format::FORMAT_VERSION,
            dim,
            padded_dim,
            metric: spec.metric,
            id_type: spec.id_type,
            rows: rows as u64,
            nlist,
            blocks,
            raw_precision: build.raw_precision,
            rotation_seed: build.seed,
            query_bits: quiver_simd::RABITQ_QUERY_BITS,
            block_rows: RABITQ_BLOCK_ROWS,
            fields: spec.fields.clone(),
            collection: spec.collection.clone(),
        };

        let total_sections = SectionKind::ALL.len() as u64;
        let mut file = SectionWriter::new(out);
        let mut step = 0u64;
        let mut advance = || {
            step += 1;
            progress(BuildStage::Writing, step, total_sections);
        };

        file.section(SectionKind::Header, |w| {
            w.write(&serde_json::to_vec(&header).expect("header"))
        })?;
        advance();
        file.section(SectionKind::Centroids, |w| {
            w.write(bytemuck::cast_slice(&rotated_centroids))
        })?;
        advance();
        file.section(SectionKind::ClusterDirectory, |w| {
            w.write(bytemuck::cast_slice(&directory))
        })?;
        advance();
        // Per list: its code blocks, then the same blocks' factors, so a probe is
        // one contiguous read.
        file.section(SectionKind::Codes, |w| {
            let code_block = words * RABITQ_BLOCK_ROWS;
            let factor_block = FACTOR_BLOCK_BYTES / 4;
            for &[_, size, block_start] in &directory {
                let (first, count) = (
                    block_start as usize,
                    (size as usize).div_ceil(RABITQ_BLOCK_ROWS),
                );
                w.write(bytemuck::cast_slice(
                    &codes[first * code_block..(first + count) * code_block],
                ))?;
                w.write(bytemuck::cast_slice(
                    &factors[first * factor_block..(first + count) * factor_block],
                ))?;
            }
            Ok(())
        })?;
        advance();
        file.section(SectionKind::RowIds, |w| write_ids(w, &self.ids, &order))?;
        advance();
        file.section(SectionKind::RawVectors, |w| {
            let mut row_buffer: Vec<u16> = Vec::with_capacity(dim);
            for &input in &order {
                let vector = &self.vectors[input as usize * dim..][..dim];
                match build.raw_precision {
                    RawPrecision::F32 => w.write(bytemuck::cast_slice(vector))?,
                    RawPrecision::Bf16 => {
                        row_buffer.clear();
                        row_buffer.extend(vector.iter().map(|&v| quiver_simd::f32_to_bf16_bits(v)));
                        w.write(bytemuck::cast_slice(&row_buffer))?;
                    }
                }
            }
            Ok(())
        })?;
        advance();
        file.section(SectionKind::Payloads, |w| {
            let mut offset = 0u64;
            w.write(&offset.to_le_bytes())?;
            for &input in &order {
                offset += self.payloads[input as usize]
                    .as_ref()
                    .map_or(0, |p| p.len() as u64);
                w.write(&offset.to_le_bytes())?;
            }
            for &input in &order {
                if let Some(payload) = &self.payloads[input as usize] {
                    w.write(payload)?;
                }
            }
            Ok(())
        })?;
        advance();
        let ordered_values: Vec<Vec<Option<FieldValue>>> = order
            .iter()
            .map(|&input| self.field_values[input as usize].clone())
            .collect();
        file.section(SectionKind::Fields, |w| {
            w.write(&fields::encode_columns(&spec.fields, &ordered_values))
        })?;
        advance();
        let mut position_of_input = vec![0u32; rows];
        for (row, &input) in order.iter().enumerate() {
            position_of_input[input as usize] = row as u32;
        }
        file.section(SectionKind::IdLookup, |w| match &id_lookup {
            IdLookup::U64(sorted) => {
                let ids: Vec<u64> = sorted.iter().map(|(id, _)| *id).collect();
                let rows: Vec<u32> = sorted
                    .iter()
                    .map(|(_, input)| position_of_input[*input as usize])
                    .collect();
                w.write(bytemuck::cast_slice(&ids))?;
                w.write(bytemuck::cast_slice(&rows))
            }
            IdLookup::String(sorted_inputs) => {
                let rows: Vec<u32> = sorted_inputs
                    .iter()
                    .map(|input| position_of_input[*input as usize])
                    .collect();
                w.write(bytemuck::cast_slice(&rows))
            }
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
            rows: rows as u64,
            nlist,
            file_bytes,
            hot_bytes,
            raw_bytes,
        })
    }
}

enum IdLookup {
    /// `(id, input row)` sorted by id.
    U64(Vec<(u64, u32)>),
    /// Input rows sorted by their string id.
    String(Vec<u32>),
}

fn build_id_lookup(ids: &[PointId]) -> IndexResult<IdLookup> {
    let duplicate =
        |id: &PointId| IndexError::InvalidArgument(format!("id {id} appears twice in one segment"));
    if matches!(ids.first(), Some(PointId::String(_))) {
        let mut sorted: Vec<u32> = (0..ids.len() as u32).collect();
        sorted.sort_by(|&a, &b| ids[a as usize].cmp(&ids[b as usize]));
        if let Some(pair) = sorted
            .windows(2)
            .find(|p| ids[p[0] as usize] == ids[p[1] as usize])
        {
            return Err(duplicate(&ids[pair[0] as usize]));
        }
        return Ok(IdLookup::String(sorted));
    }
    let mut sorted: Vec<(u64, u32)> = ids
        .iter()
        .enumerate()
        .map(|(input, id)| match id {
            PointId::U64(value) => (*value, input as u32),
            PointId::String(_) => unreachable!("ids are checked against the id type on add"),
        })
        .collect();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|p| p[0].0 == p[1].0) {
        return Err(duplicate(&PointId::U64(pair[0].0)));
    }
    Ok(IdLookup::U64(sorted))
}

fn write_ids(w: &mut SectionSink<'_, '_>, ids: &[PointId], order: &[u32]) -> IndexResult<()> {
    match ids.first() {
        Some(PointId::String(_)) => {
            let mut offset = 0u32;
            w.write(&offset.to_le_bytes())?;
            for &input in order {
                if let PointId::String(text) = &ids[input as usize] {
                    offset += text.len() as u32;
                }
                w.write(&offset.to_le_bytes())?;
            }
            for &input in order {
                if let PointId::String(text) = &ids[input as usize] {
                    w.write(text.as_bytes())?;
                }
            }
        }
        _ => {
            for &input in order {
                if let PointId::U64(id) = ids[input as usize] {
                    w.write(&id.to_le_bytes())?;
                }
            }
        }
    }
    Ok(())
}

/// Writes sections back to back with padding, tracking offsets and checksums.
struct SectionWriter<'a> {
    out: &'a mut dyn Write,
    position: u64,
    entries: Vec<SectionEntry>,
    chunk_crcs: Vec<u32>,
}

/// The open section of a [`SectionWriter`].
struct SectionSink<'w, 'a> {
    writer: &'w mut SectionWriter<'a>,
    length: u64,
    crc: u32,
    chunk_crc: u32,
}

impl SectionSink<'_, '_> {
    fn write(&mut self, mut bytes: &[u8]) -> IndexResult<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        while !bytes.is_empty() {
            let room = (CHUNK_BYTES - self.length % CHUNK_BYTES) as usize;
            let (head, tail) = bytes.split_at(room.min(bytes.len()));
            self.chunk_crc = crc32c::crc32c_append(self.chunk_crc, head);
            self.writer.raw_write(head)?;
            self.length += head.len() as u64;
            if self.length.is_multiple_of(CHUNK_BYTES) {
                self.writer.chunk_crcs.push(self.chunk_crc);
                self.chunk_crc = 0;
            }
            bytes = tail;
        }
        Ok(())
    }
}

impl<'a> SectionWriter<'a> {
    fn new(out: &'a mut dyn Write) -> Self {
        SectionWriter {
            out,
            position: 0,
            entries: Vec::new(),
            chunk_crcs: Vec::new(),
        }
    }

    fn raw_write(&mut self, bytes: &[u8]) -> IndexResult<()> {
        self.out.write_all(bytes).map_err(|source| IndexError::Io {
            object: "segment output".into(),
            source,
        })?;
        self.position += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, alignment: u64) -> IndexResult<()> {
        let padding = (alignment - self.position % alignment) % alignment;
        self.raw_write(&vec![0u8; padding as usize])
    }

    fn section(
        &mut self,
        kind: SectionKind,
        fill: impl FnOnce(&mut SectionSink<'_, 'a>) -> IndexResult<()>,
    ) -> IndexResult<()> {
        self.pad_to(SECTION_ALIGN)?;
        let offset = self.position;
        let first_chunk = self.chunk_crcs.len() as u32;
        let mut sink = SectionSink {
            writer: self,
            length: 0,
            crc: 0,
            chunk_crc: 0,
        };
        fill(&mut sink)?;
        let (length, crc, chunk_crc) = (sink.length, sink.crc, sink.chunk_crc);
        if length % CHUNK_BYTES != 0 {
            self.chunk_crcs.push(chunk_crc);
        }
        self.entries.push(SectionEntry {
            kind,
            offset,
            length,
            crc,
            first_chunk,
        });
        Ok(())
    }

    /// Writes the chunk checksums, the footer and the trailer; returns the file size.
    fn finish(mut self) -> IndexResult<u64> {
        let chunk_crcs = std::mem::take(&mut self.chunk_crcs);
        self.pad_to(SECTION_ALIGN)?;
        let offset = self.position;
        let bytes: &[u8] = bytemuck::cast_slice(&chunk_crcs);
        self.raw_write(bytes)?;
        self.entries.push(SectionEntry {
            kind: SectionKind::ChunkChecksums,
            offset,
            length: bytes.len() as u64,
            crc: crc32c::crc32c(bytes),
            first_chunk: chunk_crcs.len() as u32,
        });
        self.pad_to(8)?;
        let footer = format::encode_footer(&self.entries);
        let footer_offset = self.position;
        self.raw_write(&footer)?;
        let trailer = format::encode_trailer(footer_offset, &footer);
        self.raw_write(&trailer)?;
        self.out.flush().map_err(|source| IndexError::Io {
            object: "segment output".into(),
            source,
        })?;
        Ok(self.position)
    }
}
