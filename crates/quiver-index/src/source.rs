//! Byte sources: where a segment's bytes come from. The index never does I/O
//! itself; it asks a source for ranges and gets borrowed slices back (zero copy).

use std::borrow::Cow;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use crate::error::{IndexError, IndexResult};
use crate::format::ChunkChecksums;

/// How a range is about to be read, so a cache can advise the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessPattern {
    /// Scanned front to back (codes, factors).
    Sequential,
    /// Touched at scattered offsets (raw vectors for rescoring, payloads).
    Random,
}

/// A read-only, random-access view of one object (a segment file).
///
/// `read_at` returns a handle that dereferences to the requested bytes; for a
/// mapped file or memory buffer it is a plain borrowed slice, for a cache it also
/// pins the memory until dropped. Section offsets in a segment are 4 KiB-aligned,
/// and sources must preserve at least 8-byte alignment of the object's start.
pub trait ByteSource: Send + Sync {
    /// The borrowed bytes of one read.
    type Bytes<'a>: Deref<Target = [u8]>
    where
        Self: 'a;

    /// Returns the object's size in bytes.
    fn size(&self) -> u64;

    /// Returns `length` bytes starting at `offset`, or an error if the range is
    /// outside the object or cannot be read.
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Self::Bytes<'_>>;

    /// Returns the object's name (path or object-store key) used in errors.
    fn name(&self) -> &str;

    /// Hints how a range will be read; sources may ignore it.
    fn advise(&self, _offset: u64, _length: usize, _pattern: AccessPattern) {}

    /// Says the bytes of a range failed their checksum: a source that keeps
    /// copies (a cache) drops them, so the next read fetches them again. Sources
    /// that read the object itself ignore it.
    fn discard(&self, _offset: u64, _length: u64) {}

    /// Hands the source the segment's chunk checksums once the segment is open.
    /// A source that keeps copies of the bytes it may fetch again later (a cache,
    /// after an eviction) takes them and returns true: it then checks the chunks
    /// under every copy it makes before handing out any of its bytes, so the
    /// segment does not check reads itself. Sources whose bytes never change
    /// return false, and the segment checks each chunk on its first read.
    fn verify_with(&self, _checksums: &Arc<ChunkChecksums>) -> bool {
        false
    }

    /// Makes the ranges `(offset, length)` resident before they are read one by
    /// one (the raw vectors of a list's rescoring candidates): a cache fetches
    /// the missing ones concurrently and waits for them, so a query waits for one
    /// round trip, not one per row. Sources in memory ignore it; errors are left
    /// to the reads that follow.
    fn fetch_ahead(&self, _ranges: &[(u64, usize)]) {}

    /// A read session: many reads of one query against this source.
    type Session<'a>: ReadSession
    where
        Self: 'a;

    /// Starts a read session. A cache pins each region once per session (instead
    /// of once per read) and releases the pins when the session is dropped, so a
    /// query's hundreds of small reads cost no atomic operations after the first
    /// touch of each region.
    fn session(&self) -> Self::Session<'_>;
}

/// Reads of one query (see [`ByteSource::session`]); bytes borrow the session.
pub trait ReadSession {
    /// Returns `length` bytes starting at `offset`: a borrowed slice, or a copy
    /// when the source had to assemble the range (a cache-region boundary).
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Cow<'_, [u8]>>;
}

/// The session of a source that is one slice of memory (a buffer, a mapped file):
/// reads are plain borrowed sub-slices.
pub struct DirectSession<'a> {
    name: &'a str,
    bytes: &'a [u8],
}

impl<'a> DirectSession<'a> {
    /// Returns a session over the whole object `bytes`, called `name` in errors.
    pub fn new(name: &'a str, bytes: &'a [u8]) -> Self {
        DirectSession { name, bytes }
    }
}

impl ReadSession for DirectSession<'_> {
    #[inline]
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Cow<'_, [u8]>> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.bytes.len() as u64);
        match end {
            Some(end) => Ok(Cow::Borrowed(&self.bytes[offset as usize..end as usize])),
            None => Err(out_of_range(
                self.name,
                offset,
                length,
                self.bytes.len() as u64,
            )),
        }
    }
}

fn out_of_range(name: &str, offset: u64, length: usize, size: u64) -> IndexError {
    IndexError::corrupted(
        name,
        format!(
            "range {offset}..{} is outside the object of {size} bytes",
            offset + length as u64
        ),
    )
}

/// An in-memory segment in an 8-byte aligned buffer (enough for every section's
/// element type).
pub struct MemorySource {
    name: String,
    words: Vec<u64>,
    size: usize,
}

impl MemorySource {
    /// Returns a source holding a copy of `bytes`.
    pub fn new(name: impl Into<String>, bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        MemorySource {
            name: name.into(),
            words,
            size: bytes.len(),
        }
    }

    fn whole(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.size]
    }
}

impl ByteSource for MemorySource {
    type Bytes<'a> = &'a [u8];
    type Session<'a> = DirectSession<'a>;

    fn session(&self) -> DirectSession<'_> {
        DirectSession::new(&self.name, self.whole())
    }

    fn size(&self) -> u64 {
        self.size as u64
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<&[u8]> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.size as u64);
        match end {
            Some(end) => Ok(&self.whole()[offset as usize..end as usize]),
            None => Err(out_of_range(&self.name, offset, length, self.size as u64)),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// Asks the kernel to read the ranges `(offset, length)` of `map` in the
/// background, all at once, instead of one page fault after the other as they
/// are read (ranges past the end are cut; advice errors are ignored: the reads
/// fault the pages in anyway).
pub fn advise_will_need(map: &memmap2::Mmap, ranges: &[(u64, usize)]) {
    for &(offset, length) in ranges {
        let end = offset.saturating_add(length as u64).min(map.len() as u64);
        if offset < end {
            let _ = map.advise_range(
                memmap2::Advice::WillNeed,
                offset as usize,
                (end - offset) as usize,
            );
        }
    }
}

/// A segment file on local disk, memory-mapped read-only.
pub struct MmapSource {
    name: String,
    map: memmap2::Mmap,
}

impl MmapSource {
    /// Opens and maps the file at `path`.
    pub fn open(path: &Path) -> IndexResult<Self> {
        let name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| IndexError::Io {
            object: name.clone(),
            source,
        })?;
        // SAFETY: segment files are immutable once written (they are renamed into
        // place complete and never modified), so the mapping cannot change under us.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| IndexError::Io {
            object: name.clone(),
            source,
        })?;
        Ok(MmapSource { name, map })
    }

    /// Maps an open segment file (e.g. an unnamed scratch file a segment was
    /// just written to); errors name `name`. The file must not change while
    /// the source lives, as for [`MmapSource::open`].
    pub fn map_file(file: &std::fs::File, name: impl Into<String>) -> IndexResult<Self> {
        let name = name.into();
        // SAFETY: as in `open`: the caller hands over a finished segment file
        // that nothing writes to any more.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|source| IndexError::Io {
            object: name.clone(),
            source,
        })?;
        Ok(MmapSource { name, map })
    }

    /// Returns the source renamed (errors name `name`, e.g. the object key a
    /// downloaded file came from, instead of the local path).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    fn whole(&self) -> &[u8] {
        &self.map
    }
}

impl ByteSource for MmapSource {
    type Bytes<'a> = &'a [u8];
    type Session<'a> = DirectSession<'a>;

    fn session(&self) -> DirectSession<'_> {
        DirectSession::new(&self.name, self.whole())
    }

    fn size(&self) -> u64 {
        self.map.len() as u64
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<&[u8]> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.map.len() as u64);
        match end {
            Some(end) => Ok(&self.map[offset as usize..end as usize]),
            None => Err(out_of_range(
                &self.name,
                offset,
                length,
                self.map.len() as u64,
            )),
        }
    }

    fn fetch_ahead(&self, ranges: &[(u64, usize)]) {
        advise_will_need(&self.map, ranges);
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn advise(&self, offset: u64, length: usize, pattern: AccessPattern) {
        let advice = match pattern {
            AccessPattern::Sequential => memmap2::Advice::Sequential,
            AccessPattern::Random => memmap2::Advice::Random,
        };
        // Advice is a hint; a failure (e.g. an unaligned range) changes nothing.
        let page = 4096u64;
        let aligned_offset = offset / page * page;
        let aligned_length = (offset + length as u64 - aligned_offset) as usize;
        let _ = self
            .map
            .advise_range(advice, aligned_offset as usize, aligned_length);
    }
}
