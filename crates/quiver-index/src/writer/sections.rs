//! The segment file's bytes: sections written back to back with padding,
//! per-section and per-chunk checksums, the footer and the trailer; and the
//! encodings of the sections that are more than one slice (codes, ids, id
//! lookup).

use std::io::Write;

use quiver_simd::RABITQ_BLOCK_ROWS;

use super::{EncodedLists, ListLayout, PointId};
use crate::error::{IndexError, IndexResult};
use crate::format::{self, CHUNK_BYTES, ROW_CHUNK_BYTES, SECTION_ALIGN, SectionEntry, SectionKind};
use crate::rabitq::FACTOR_BLOCK_BYTES;

/// Writes, per list, its code blocks and then the same blocks' factors, so a
/// probe is one contiguous read.
pub(super) fn write_codes(
    w: &mut SectionSink<'_, '_>,
    layout: &ListLayout,
    encoded: &EncodedLists,
    words: usize,
) -> IndexResult<()> {
    let code_block = words * RABITQ_BLOCK_ROWS;
    let factor_block = FACTOR_BLOCK_BYTES / 4;
    for &[_, size, block_start] in &layout.directory {
        let (first, count) = (
            block_start as usize,
            (size as usize).div_ceil(RABITQ_BLOCK_ROWS),
        );
        w.write(bytemuck::cast_slice(
            &encoded.codes[first * code_block..(first + count) * code_block],
        ))?;
        w.write(bytemuck::cast_slice(
            &encoded.factors[first * factor_block..(first + count) * factor_block],
        ))?;
    }
    Ok(())
}

/// Writes the id lookup: sorted ids (u64) or string-sorted rows, each mapped to
/// its segment row.
pub(super) fn write_id_lookup(
    w: &mut SectionSink<'_, '_>,
    id_lookup: &IdLookup,
    order: &[u32],
) -> IndexResult<()> {
    let mut position_of_input = vec![0u32; order.len()];
    for (row, &input) in order.iter().enumerate() {
        position_of_input[input as usize] = row as u32;
    }
    match id_lookup {
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
    }
}

pub(super) enum IdLookup {
    /// `(id, input row)` sorted by id.
    U64(Vec<(u64, u32)>),
    /// Input rows sorted by their string id.
    String(Vec<u32>),
}

pub(super) fn build_id_lookup(ids: &[PointId]) -> IndexResult<IdLookup> {
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

pub(super) fn write_ids(
    w: &mut SectionSink<'_, '_>,
    ids: &[PointId],
    order: &[u32],
) -> IndexResult<()> {
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
pub(super) struct SectionWriter<'a> {
    out: &'a mut dyn Write,
    position: u64,
    pub(super) entries: Vec<SectionEntry>,
    chunk_crcs: Vec<u32>,
}

/// The open section of a [`SectionWriter`].
pub(super) struct SectionSink<'w, 'a> {
    writer: &'w mut SectionWriter<'a>,
    chunk_bytes: u64,
    /// Extends a checksum by one whole chunk.
    append_chunk: CrcShift,
    length: u64,
    /// The checksum of the section's whole chunks so far.
    crc: u32,
    chunk_crc: u32,
}

impl SectionSink<'_, '_> {
    pub(super) fn write(&mut self, mut bytes: &[u8]) -> IndexResult<()> {
        while !bytes.is_empty() {
            let room = (self.chunk_bytes - self.length % self.chunk_bytes) as usize;
            let (head, tail) = bytes.split_at(room.min(bytes.len()));
            self.chunk_crc = crc32c::crc32c_append(self.chunk_crc, head);
            self.writer.raw_write(head)?;
            self.length += head.len() as u64;
            if self.length.is_multiple_of(self.chunk_bytes) {
                // The section's checksum from its chunks' (each byte read once).
                self.crc = self.append_chunk.apply(self.crc) ^ self.chunk_crc;
                self.writer.chunk_crcs.push(self.chunk_crc);
                self.chunk_crc = 0;
            }
            bytes = tail;
        }
        Ok(())
    }

    /// The checksum of everything written to the section.
    fn section_crc(&self) -> u32 {
        let partial = (self.length % self.chunk_bytes) as usize;
        crc32c::crc32c_combine(self.crc, self.chunk_crc, partial)
    }
}

/// crc32c(A ‖ B) from crc32c(A) and crc32c(B) for every B of one length:
/// crc32c(A) shifted over that many bytes (a linear map on its 32 bits, built
/// once from `crc32c_combine`), then xor crc32c(B). One combine call per chunk
/// costs about as much as checksumming a 64 KiB chunk again; this costs 32
/// xors at most.
#[derive(Clone, Copy)]
struct CrcShift([u32; 32]);

impl CrcShift {
    fn new(length: usize) -> Self {
        CrcShift(std::array::from_fn(|bit| {
            crc32c::crc32c_combine(1 << bit, 0, length)
        }))
    }

    fn apply(&self, crc: u32) -> u32 {
        let mut shifted = 0;
        let mut bits = crc;
        while bits != 0 {
            shifted ^= self.0[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        shifted
    }
}

impl<'a> SectionWriter<'a> {
    pub(super) fn new(out: &'a mut dyn Write) -> Self {
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

    pub(super) fn section(
        &mut self,
        kind: SectionKind,
        fill: impl FnOnce(&mut SectionSink<'_, 'a>) -> IndexResult<()>,
    ) -> IndexResult<()> {
        // A section with small chunks starts on a chunk boundary of the object,
        // so a cache's small regions line up with its chunks.
        let chunk_bytes = kind.chunk_bytes();
        self.pad_to(SECTION_ALIGN.max(chunk_bytes.min(ROW_CHUNK_BYTES)))?;
        let offset = self.position;
        let first_chunk = self.chunk_crcs.len() as u32;
        let mut sink = SectionSink {
            writer: self,
            chunk_bytes,
            append_chunk: CrcShift::new(chunk_bytes as usize),
            length: 0,
            crc: 0,
            chunk_crc: 0,
        };
        fill(&mut sink)?;
        let (length, crc, chunk_crc) = (sink.length, sink.section_crc(), sink.chunk_crc);
        if length % chunk_bytes != 0 {
            self.chunk_crcs.push(chunk_crc);
        }
        self.entries.push(SectionEntry {
            kind,
            offset,
            length,
            crc,
            first_chunk,
            chunk_bytes,
        });
        Ok(())
    }

    /// Writes the chunk checksums, the footer and the trailer; returns the file size.
    pub(super) fn finish(mut self) -> IndexResult<u64> {
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
            chunk_bytes: CHUNK_BYTES,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_checksum_from_its_chunks_is_the_checksum_of_its_bytes() {
        let bytes: Vec<u8> = (0..5 * 4096 + 1234)
            .map(|index: usize| (index.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for chunk in [1usize, 7, 4096, 5000] {
            for length in [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk, bytes.len()] {
                let data = &bytes[..length.min(bytes.len())];
                let mut out = Vec::new();
                let mut writer = SectionWriter::new(&mut out);
                let mut sink = SectionSink {
                    writer: &mut writer,
                    chunk_bytes: chunk as u64,
                    append_chunk: CrcShift::new(chunk),
                    length: 0,
                    crc: 0,
                    chunk_crc: 0,
                };
                // In pieces that straddle chunk boundaries.
                for piece in data.chunks(777) {
                    sink.write(piece).unwrap();
                }
                assert_eq!(
                    sink.section_crc(),
                    crc32c::crc32c(data),
                    "chunk {chunk}, length {}",
                    data.len()
                );
                let whole: Vec<u32> = data.chunks_exact(chunk).map(crc32c::crc32c).collect();
                assert_eq!(writer.chunk_crcs, whole);
            }
        }
    }
}
