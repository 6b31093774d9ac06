//! Segment file (v2; v1 still read): constants, the section table (footer) and
//! the trailer.
//!
//! ```text
//! [section 0][pad to 4 KiB][section 1][pad]...[chunk checksums][pad][footer][trailer]
//! footer  = u32 entry count, then per section: kind u32, flags u32, offset u64,
//!           length u64, crc32c u32, first chunk u32            (32 bytes each)
//! flags   = bits 0..8: log2 of the section's chunk size (0: 1 MiB, all of v1)
//! trailer = footer offset u64, footer length u32, footer crc32c u32,
//!           format version u32, reserved u32, magic "QVRSEG\0\x01"   (32 bytes)
//! ```
//!
//! Every section has a crc32c of its whole contents, and one crc32c per chunk (in
//! the chunk-checksum section) so a reader can verify exactly the chunks it
//! touches, once, without reading whole sections. Chunks are 1 MiB, except in the
//! sections read a row at a time (raw vectors, payloads), whose chunks are 64 KiB
//! from v2 on and which start on a chunk boundary of the object: a rescore of one
//! row checks (and a cache fetches) 64 KiB, not 1 MiB. All integers are
//! little-endian.

use crate::error::{IndexError, IndexResult};

/// Format version this build writes (it reads every version from
/// [`OLDEST_FORMAT_VERSION`] on).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads (v1: every chunk 1 MiB).
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// Trailing magic bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"QVRSEG\0\x01";
/// Bytes of the fixed trailer.
pub const TRAILER_BYTES: usize = 32;
/// Alignment of every section's start.
pub const SECTION_ALIGN: u64 = 4096;
/// Granularity of the lazy chunk checksums.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// Chunk size of the sections read a row at a time (raw vectors, payloads),
/// from format v2 on; such a section starts on a multiple of it.
pub const ROW_CHUNK_BYTES: u64 = 64 << 10;
/// Bits of a footer entry's flags holding log2 of its chunk size.
const CHUNK_SHIFT_MASK: u32 = 0xFF;
const FOOTER_ENTRY_BYTES: usize = 32;

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SectionKind {
    /// JSON header: collection parameters, row count, rotation seed, schema.
    Header = 1,
    /// Rotated centroids, `nlist × padded_dim` f32.
    Centroids = 2,
    /// Per list: first row, row count, first code block (3 × u32).
    ClusterDirectory = 3,
    /// Per list: its RaBitQ code blocks (32 rows each, word-major inside a block),
    /// then the same blocks' correction factors (4 × 32 f32 per block).
    Codes = 4,
    /// Point ids in row order.
    RowIds = 6,
    /// Full vectors in row order (f32 or bf16).
    RawVectors = 7,
    /// JSON payloads: `(rows + 1)` u64 offsets, then the bytes.
    Payloads = 8,
    /// Filterable field columns.
    Fields = 9,
    /// Ids sorted, for id → row lookups.
    IdLookup = 10,
    /// crc32c of every 1 MiB chunk of every other section.
    ChunkChecksums = 11,
}

impl SectionKind {
    /// Every kind, in the order the writer emits them.
    pub const ALL: [SectionKind; 10] = [
        SectionKind::Header,
        SectionKind::Centroids,
        SectionKind::ClusterDirectory,
        SectionKind::Codes,
        SectionKind::RowIds,
        SectionKind::RawVectors,
        SectionKind::Payloads,
        SectionKind::Fields,
        SectionKind::IdLookup,
        SectionKind::ChunkChecksums,
    ];

    fn from_u32(value: u32) -> Option<Self> {
        SectionKind::ALL
            .into_iter()
            .find(|kind| *kind as u32 == value)
    }

    /// Returns a lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Header => "header",
            SectionKind::Centroids => "centroids",
            SectionKind::ClusterDirectory => "cluster directory",
            SectionKind::Codes => "codes",
            SectionKind::RowIds => "row ids",
            SectionKind::RawVectors => "raw vectors",
            SectionKind::Payloads => "payloads",
            SectionKind::Fields => "fields",
            SectionKind::IdLookup => "id lookup",
            SectionKind::ChunkChecksums => "chunk checksums",
        }
    }
}

/// One entry of the footer: where a section is and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SectionEntry {
    /// What the section holds.
    pub kind: SectionKind,
    /// Byte offset in the file (4 KiB-aligned).
    pub offset: u64,
    /// Length in bytes (without padding).
    pub length: u64,
    /// crc32c of the whole section.
    pub crc: u32,
    /// Index of the section's first chunk checksum.
    pub first_chunk: u32,
    /// Bytes per checksummed chunk (a power of two, 4 KiB to 1 MiB).
    pub chunk_bytes: u64,
}

impl SectionEntry {
    /// Returns how many chunks the section spans.
    pub fn chunk_count(&self) -> u64 {
        self.length.div_ceil(self.chunk_bytes)
    }
}

impl SectionKind {
    /// The chunk size the writer gives a section of this kind.
    pub(crate) fn chunk_bytes(self) -> u64 {
        match self {
            SectionKind::RawVectors | SectionKind::Payloads => ROW_CHUNK_BYTES,
            _ => CHUNK_BYTES,
        }
    }
}

/// The parsed trailer.
#[derive(Clone, Copy, Debug)]
pub struct Trailer {
    pub footer_offset: u64,
    pub footer_length: u32,
    pub footer_crc: u32,
}

pub(crate) fn encode_footer(entries: &[SectionEntry]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(4 + entries.len() * FOOTER_ENTRY_BYTES);
    bytes.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in entries {
        bytes.extend_from_slice(&(entry.kind as u32).to_le_bytes());
        let flags = if entry.chunk_bytes == CHUNK_BYTES {
            0
        } else {
            entry.chunk_bytes.trailing_zeros()
        };
        bytes.extend_from_slice(&flags.to_le_bytes());
        bytes.extend_from_slice(&entry.offset.to_le_bytes());
        bytes.extend_from_slice(&entry.length.to_le_bytes());
        bytes.extend_from_slice(&entry.crc.to_le_bytes());
        bytes.extend_from_slice(&entry.first_chunk.to_le_bytes());
    }
    bytes
}

pub(crate) fn encode_trailer(footer_offset: u64, footer: &[u8]) -> [u8; TRAILER_BYTES] {
    let mut trailer = [0u8; TRAILER_BYTES];
    trailer[0..8].copy_from_slice(&footer_offset.to_le_bytes());
    trailer[8..12].copy_from_slice(&(footer.len() as u32).to_le_bytes());
    trailer[12..16].copy_from_slice(&crc32c::crc32c(footer).to_le_bytes());
    trailer[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    trailer[24..32].copy_from_slice(&MAGIC);
    trailer
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

pub(crate) fn decode_trailer(object: &str, file_size: u64, bytes: &[u8]) -> IndexResult<Trailer> {
    if bytes[24..32] != MAGIC {
        return Err(IndexError::corrupted(
            object,
            "no segment trailer magic at the end of the object (truncated or not a segment)",
        ));
    }
    let version = u32_at(bytes, 16);
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(IndexError::UnsupportedVersion {
            object: object.to_string(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let trailer = Trailer {
        footer_offset: u64_at(bytes, 0),
        footer_length: u32_at(bytes, 8),
        footer_crc: u32_at(bytes, 12),
    };
    let footer_end = trailer
        .footer_offset
        .checked_add(trailer.footer_length as u64);
    if footer_end != Some(file_size - TRAILER_BYTES as u64) {
        return Err(IndexError::corrupted(
            object,
            "footer location does not match the object size",
        ));
    }
    Ok(trailer)
}

pub(crate) fn decode_footer(
    object: &str,
    footer: &[u8],
    data_end: u64,
) -> IndexResult<Vec<SectionEntry>> {
    let corrupted = |reason: String| IndexError::corrupted(object, reason);
    if footer.len() < 4 {
        return Err(corrupted("footer too short".into()));
    }
    let count = u32_at(footer, 0) as usize;
    if footer.len() != 4 + count * FOOTER_ENTRY_BYTES {
        return Err(corrupted(format!(
            "footer length {} does not hold {count} entries",
            footer.len()
        )));
    }
    let mut entries: Vec<SectionEntry> = Vec::with_capacity(count);
    for index in 0..count {
        let at = 4 + index * FOOTER_ENTRY_BYTES;
        let kind_value = u32_at(footer, at);
        let kind = SectionKind::from_u32(kind_value)
            .ok_or_else(|| corrupted(format!("unknown section kind {kind_value}")))?;
        let chunk_bytes = match u32_at(footer, at + 4) & CHUNK_SHIFT_MASK {
            0 => CHUNK_BYTES,
            shift @ 12..=20 => 1u64 << shift,
            shift => {
                return Err(corrupted(format!(
                    "{} section has a chunk size of 2^{shift} bytes",
                    kind.name()
                )));
            }
        };
        let entry = SectionEntry {
            kind,
            offset: u64_at(footer, at + 8),
            length: u64_at(footer, at + 16),
            crc: u32_at(footer, at + 24),
            first_chunk: u32_at(footer, at + 28),
            chunk_bytes,
        };
        if !entry.offset.is_multiple_of(SECTION_ALIGN) {
            return Err(corrupted(format!(
                "{} section offset {} is not aligned",
                kind.name(),
                entry.offset
            )));
        }
        let end = entry.offset.checked_add(entry.length);
        if end.is_none_or(|end| end > data_end) {
            return Err(corrupted(format!(
                "{} section extends past the data area",
                kind.name()
            )));
        }
        if let Some(previous) = entries.last()
            && entry.offset < previous.offset + previous.length
        {
            return Err(corrupted(format!(
                "{} section overlaps the previous one",
                kind.name()
            )));
        }
        if entries.iter().any(|other| other.kind == kind) {
            return Err(corrupted(format!("duplicate {} section", kind.name())));
        }
        entries.push(entry);
    }
    for kind in SectionKind::ALL {
        if !entries.iter().any(|entry| entry.kind == kind) {
            return Err(corrupted(format!("missing {} section", kind.name())));
        }
    }
    Ok(entries)
}

/// One checksummed chunk of a segment: 1 MiB of one section (its last chunk may be
/// shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChunk {
    /// Object offset of the chunk's first byte.
    pub start: u64,
    /// Object offset just past the chunk's last byte.
    pub end: u64,
    /// crc32c of the chunk's bytes.
    pub crc: u32,
    /// The section the chunk belongs to.
    pub section: SectionKind,
    /// The chunk's index inside its section.
    pub index: u64,
}

impl std::fmt::Display for SegmentChunk {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} section, chunk {} (bytes {}..{})",
            self.section.name(),
            self.index,
            self.start,
            self.end
        )
    }
}

impl SegmentChunk {
    /// Tells whether `bytes`, the chunk's whole range, match its checksum.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.end - self.start && crc32c::crc32c(bytes) == self.crc
    }
}

/// Every checksummed chunk of one segment, in object order: what a byte source
/// that keeps copies of a segment's bytes (a cache, which fetches them again after
/// an eviction) needs to check each copy it makes. The chunk-checksum section
/// itself, the footer and the trailer have their own checksums, checked when the
/// segment is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkChecksums {
    /// Indexed by global chunk number (a section's `first_chunk` plus its chunk).
    chunks: Vec<SegmentChunk>,
}

impl ChunkChecksums {
    /// Builds the table from a checked footer (sections in increasing offset, their
    /// `first_chunk` numbering consecutive) and the chunk-checksum section.
    pub(crate) fn new(sections: &[SectionEntry], crcs: &[u32]) -> Self {
        let chunks: Vec<SegmentChunk> = sections
            .iter()
            .filter(|section| section.kind != SectionKind::ChunkChecksums)
            .flat_map(|section| {
                (0..section.chunk_count()).map(move |index| {
                    let start = section.offset + index * section.chunk_bytes;
                    SegmentChunk {
                        start,
                        end: (start + section.chunk_bytes).min(section.offset + section.length),
                        crc: crcs[section.first_chunk as usize + index as usize],
                        section: section.kind,
                        index,
                    }
                })
            })
            .collect();
        debug_assert!(
            chunks.windows(2).all(|pair| pair[0].end <= pair[1].start),
            "chunks are in object order and do not overlap"
        );
        debug_assert_eq!(chunks.len(), crcs.len(), "one checksum per chunk");
        ChunkChecksums { chunks }
    }

    /// Returns the chunk with global number `index`.
    pub(crate) fn chunk(&self, index: usize) -> &SegmentChunk {
        &self.chunks[index]
    }

    /// Returns the chunks overlapping the object range `range`, in object order.
    pub fn overlapping(&self, range: std::ops::Range<u64>) -> &[SegmentChunk] {
        let first = self
            .chunks
            .partition_point(|chunk| chunk.end <= range.start);
        let end = self.chunks.partition_point(|chunk| chunk.start < range.end);
        &self.chunks[first..end.max(first)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(kind: SectionKind, offset: u64, length: u64, first_chunk: u32) -> SectionEntry {
        SectionEntry {
            kind,
            offset,
            length,
            crc: 0,
            first_chunk,
            chunk_bytes: CHUNK_BYTES,
        }
    }

    #[test]
    fn chunk_table_finds_exactly_the_chunks_under_a_range() {
        // Codes: 2.5 MiB at 8 KiB (three chunks); raw vectors: 100 bytes at 3 MiB.
        let sections = [
            section(SectionKind::Header, 0, 100, 0),
            section(SectionKind::Codes, 8192, 5 * CHUNK_BYTES / 2, 1),
            section(SectionKind::RawVectors, 3 * CHUNK_BYTES, 100, 4),
            section(SectionKind::ChunkChecksums, 3 * CHUNK_BYTES + 4096, 20, 0),
        ];
        let table = ChunkChecksums::new(&sections, &[10, 11, 12, 13, 14]);
        let crcs = |chunks: &[SegmentChunk]| chunks.iter().map(|c| c.crc).collect::<Vec<_>>();
        assert_eq!(crcs(table.overlapping(0..1)), [10]);
        // Padding between sections belongs to no chunk.
        assert!(table.overlapping(100..8192).is_empty());
        assert_eq!(crcs(table.overlapping(99..8193)), [10, 11]);
        assert_eq!(
            crcs(table.overlapping(8192 + CHUNK_BYTES..8193 + CHUNK_BYTES)),
            [12]
        );
        assert_eq!(
            crcs(table.overlapping(8191 + CHUNK_BYTES..8193 + CHUNK_BYTES)),
            [11, 12]
        );
        assert_eq!(
            crcs(table.overlapping(0..4 * CHUNK_BYTES)),
            [10, 11, 12, 13, 14]
        );
        assert!(
            table
                .overlapping(5 * CHUNK_BYTES..6 * CHUNK_BYTES)
                .is_empty()
        );
        let last_codes = table.chunk(3);
        assert_eq!(last_codes.end, 8192 + 5 * CHUNK_BYTES / 2);
        assert_eq!(last_codes.index, 2);
        assert_eq!(
            last_codes.to_string(),
            format!(
                "codes section, chunk 2 (bytes {}..{})",
                last_codes.start, last_codes.end
            )
        );
    }
}
