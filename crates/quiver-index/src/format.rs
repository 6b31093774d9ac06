//! Segment file v1: constants, the section table (footer) and the trailer.
//!
//! ```text
//! [section 0][pad to 4 KiB][section 1][pad]...[chunk checksums][pad][footer][trailer]
//! footer  = u32 entry count, then per section: kind u32, flags u32, offset u64,
//!           length u64, crc32c u32, first chunk u32            (32 bytes each)
//! trailer = footer offset u64, footer length u32, footer crc32c u32,
//!           format version u32, reserved u32, magic "QVRSEG\0\x01"   (32 bytes)
//! ```
//!
//! Every section has a crc32c of its whole contents, and one crc32c per 1 MiB chunk
//! (in the chunk-checksum section) so a reader can verify exactly the chunks it
//! touches, once, without reading whole sections. All integers are little-endian.

use crate::error::{IndexError, IndexResult};

/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Trailing magic bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"QVRSEG\0\x01";
/// Bytes of the fixed trailer.
pub const TRAILER_BYTES: usize = 32;
/// Alignment of every section's start.
pub const SECTION_ALIGN: u64 = 4096;
/// Granularity of the lazy chunk checksums.
pub const CHUNK_BYTES: u64 = 1 << 20;
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
}

impl SectionEntry {
    /// Returns how many 1 MiB chunks the section spans.
    pub fn chunk_count(&self) -> u64 {
        self.length.div_ceil(CHUNK_BYTES)
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
        bytes.extend_from_slice(&0u32.to_le_bytes());
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
    if version != FORMAT_VERSION {
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
        let entry = SectionEntry {
            kind,
            offset: u64_at(footer, at + 8),
            length: u64_at(footer, at + 16),
            crc: u32_at(footer, at + 24),
            first_chunk: u32_at(footer, at + 28),
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
