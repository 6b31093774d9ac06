//! Byte sources: where a segment's bytes come from. The index never does I/O
//! itself; it asks a source for ranges and gets borrowed slices back (zero copy).

use std::borrow::Cow;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

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

    /// [`Self::fetch_ahead`] of the ranges of several sources at once (the
    /// candidates of a search over several segments, the hits it returns): a
    /// cache fetches what all of them miss concurrently, so the query waits
    /// for the store once, not once per source.
    fn fetch_ahead_together(requests: &[(&Self, &[(u64, usize)])])
    where
        Self: Sized,
    {
        for &(source, ranges) in requests {
            source.fetch_ahead(ranges);
        }
    }

    /// Makes the ranges `(offset, length)` of a section scanned in whole, one
    /// range after the other, resident before the scan reads them (the codes of
    /// the lists a query probes): a cache fetches the missing ones concurrently
    /// and waits for them, so a cold query waits for the store once, not once
    /// per probed list — and over several segments (`requests`, each source
    /// with its ranges), once in all. Called only with sources whose
    /// [`Self::scans_ahead`] says yes. Sources in memory and mapped files
    /// ignore it (a mapped file's scanned sections come in as huge folios
    /// through faults, which read-ahead would split); errors are left to the
    /// reads that follow.
    fn fetch_scan_ahead_together(_requests: &[(&Self, &[(u64, usize)])])
    where
        Self: Sized,
    {
    }

    /// Tells whether [`Self::fetch_scan_ahead_together`] does anything for this
    /// source, so that a search builds the ranges only then.
    fn scans_ahead(&self) -> bool {
        false
    }

    /// Makes `offset..offset + length`, a whole section about to be read at
    /// once, resident first: a mapped file reads it in with read-ahead (its
    /// mapping is advised random, so faults alone would read it a page at a
    /// time), a cache fetches its missing regions together.
    fn read_ahead(&self, offset: u64, length: usize) {
        self.fetch_ahead(&[(offset, length)]);
    }

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

/// Fetch-ahead for a mapped file: asks the kernel to read a list's rescoring
/// candidates in the background, all at once, instead of one page fault after
/// the other as they are read — but only while the file is not resident.
///
/// `madvise(WILLNEED)` walks the page cache for every range even when every
/// page is already there: on a warm file it was a fifth of a query's CPU. So
/// the gate checks residency first (`mincore`, which for pages already mapped
/// reads only the page tables) and advises only the ranges that miss. Once
/// [`ReadAhead::QUIET_CALLS`] calls in a row found everything resident it stops
/// looking: one call in [`ReadAhead::SAMPLE_EVERY`] checks its first
/// [`ReadAhead::SAMPLE_RANGES`] ranges, and a miss turns it back on (a cold
/// file misses nearly everywhere, so a few ranges tell). Ranges past the end are cut; advice errors are ignored
/// (the reads fault the pages in anyway).
#[derive(Debug)]
pub struct ReadAhead {
    calls: AtomicU32,
    /// Calls in a row that found every range resident (advising while below
    /// `QUIET_CALLS`).
    quiet: AtomicU32,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead::new()
    }
}

impl ReadAhead {
    /// Calls in a row with nothing missing before the gate stops looking.
    pub const QUIET_CALLS: u32 = 8;
    /// While quiet, one call in this many is checked...
    pub const SAMPLE_EVERY: u32 = 32;
    /// ...on this many of its ranges.
    pub const SAMPLE_RANGES: usize = 2;

    /// A gate that starts by looking (a file just opened is likely cold).
    pub const fn new() -> Self {
        ReadAhead {
            calls: AtomicU32::new(0),
            quiet: AtomicU32::new(0),
        }
    }

    /// Tells whether the gate is checking every call (the file was missing
    /// pages lately).
    pub fn is_looking(&self) -> bool {
        self.quiet.load(Ordering::Relaxed) < Self::QUIET_CALLS
    }

    /// Fetches the ranges `(offset, length)` of `map` ahead of their reads (see
    /// the type); returns how many ranges were advised.
    pub fn fetch_ahead(&self, map: &memmap2::Mmap, ranges: &[(u64, usize)]) -> usize {
        self.fetch_ahead_where(map, ranges, |_, _| true)
    }

    /// [`ReadAhead::fetch_ahead`] of the ranges `wanted` says yes to (asked
    /// only when the gate looks).
    pub fn fetch_ahead_where(
        &self,
        map: &memmap2::Mmap,
        ranges: &[(u64, usize)],
        wanted: impl Fn(u64, usize) -> bool,
    ) -> usize {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let ranges = if self.is_looking() {
            ranges
        } else if call.is_multiple_of(Self::SAMPLE_EVERY) {
            &ranges[..ranges.len().min(Self::SAMPLE_RANGES)]
        } else {
            return 0;
        };
        let mut advised = 0;
        for &(offset, length) in ranges {
            let end = offset.saturating_add(length as u64).min(map.len() as u64);
            if offset >= end || !wanted(offset, length) || is_resident(map, offset, end) {
                continue;
            }
            let _ = map.advise_range(
                memmap2::Advice::WillNeed,
                offset as usize,
                (end - offset) as usize,
            );
            advised += 1;
        }
        if advised == 0 {
            let _ = self
                .quiet
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |quiet| {
                    Some(quiet.saturating_add(1))
                });
        } else {
            self.quiet.store(0, Ordering::Relaxed);
        }
        advised
    }
}

/// How a mapped segment file is advised: the one place that decides which of
/// its pages come in as 2 MiB folios.
///
/// Sections scanned on every query (codes, and the small sections sharing
/// their first huge page) are advised `MADV_HUGEPAGE` before anything reads
/// them, and are only read in by faults through the mapping (or
/// `MADV_POPULATE_READ`, which faults): a fault in a huge-page range reads a
/// whole 2 MiB folio, which the mapping maps with one TLB entry.
/// `MADV_WILLNEED` on such a range spoils it: its read-ahead makes small folios
/// whatever the mapping's advice, and a file range in small folios stays
/// mapped with 4 KiB pages for as long as it is cached. That is what happened
/// to every segment of `quiver standalone` read in cold (after a restart of
/// the machine, or once its pages had made room for other work): 0 of 10 MiB
/// of codes mapped huge, where a segment the indexer had just written was
/// mapped huge throughout.
///
/// Rows read at random (raw vectors, payloads) are not huge by default (a
/// cold read of one row would read 2 MiB); they are read ahead with
/// `MADV_WILLNEED` while the file misses pages (see [`ReadAhead`]). A reader
/// that has the memory to keep them all resident [`holds`](MappedAdvice::hold)
/// them instead: advised `MADV_HUGEPAGE` before anything reads them, then
/// warmed ([`MappedAdvice::warm`]), they are mapped with 2 MiB pages like the
/// codes. That matters: a rescoring read in a small-folio range is a TLB miss
/// per row, and on a virtual machine each is a two-level page walk — a
/// standalone whose raw vectors had come back in small folios (read in cold
/// after a restart) searched 14 % slower on its search threads (real 100k ×
/// 384, c = 16; experiments item 35).
#[derive(Debug, Default)]
pub struct MappedAdvice {
    /// Ranges advised `MADV_HUGEPAGE` (rounded to whole huge pages).
    huge: std::sync::Mutex<Vec<std::ops::Range<usize>>>,
    read_ahead: ReadAhead,
}

impl MappedAdvice {
    /// No advice given yet.
    pub fn new() -> Self {
        MappedAdvice::default()
    }

    /// The advice of a new mapping `map`, before anything reads it: all of it
    /// random to begin with (a fault reads its own page and nothing around it),
    /// then each range as [`MappedAdvice::advise`] says. The kernel's default
    /// read-around reads pages on both sides of a fault — a fault at the start
    /// of the file's last sections read the last 64 KiB of the rows before them
    /// in small folios, and a held range (see [`MappedAdvice::hold`]) ending
    /// there kept its last huge page mapped with 4 KiB pages. Sections read
    /// whole are asked for with `MADV_WILLNEED` ([`ByteSource::fetch_ahead`]).
    pub fn of_map(map: &memmap2::Mmap) -> Self {
        let _ = map.advise(memmap2::Advice::Random);
        MappedAdvice::default()
    }

    /// Advises `offset..offset + length` of `map` as read with `pattern` (a
    /// hint: a failure changes nothing but the page size).
    pub fn advise(&self, map: &memmap2::Mmap, offset: u64, length: usize, pattern: AccessPattern) {
        let Some(range) =
            crate::huge_pages::advice_range(offset, length, map.len() as u64, pattern)
        else {
            return;
        };
        let advice = match pattern {
            AccessPattern::Sequential => memmap2::Advice::HugePage,
            AccessPattern::Random => memmap2::Advice::Random,
        };
        let _ = map.advise_range(advice, range.start, range.end - range.start);
        if pattern == AccessPattern::Sequential {
            // Random as well (the `MADV_HUGEPAGE` advice replaced it): a fault
            // reads its own 2 MiB folio and no read-ahead past the range, which
            // would read the next section's first pages in small folios.
            let _ = map.advise_range(
                memmap2::Advice::Random,
                range.start,
                range.end - range.start,
            );
            self.huge
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(range);
        }
    }

    /// Holds `offset..offset + length` of `map`, rows read at random, in
    /// memory as huge pages: the whole huge pages inside the range are advised
    /// `MADV_HUGEPAGE` (the edges keep their advice), so every fault there reads
    /// a 2 MiB folio, and [`MappedAdvice::warm`] faults them in. Call it before
    /// anything reads the range: a page read in before is a small folio, mapped
    /// with 4 KiB pages for as long as it stays cached. Returns the bytes held
    /// (0 when the range holds no whole huge page or the kernel refused).
    pub fn hold(&self, map: &memmap2::Mmap, offset: u64, length: usize) -> u64 {
        let Some(range) = crate::huge_pages::advice_range(
            offset,
            length,
            map.len() as u64,
            AccessPattern::Random,
        ) else {
            return 0;
        };
        if map
            .advise_range(memmap2::Advice::HugePage, range.start, range.len())
            .is_err()
        {
            return 0;
        }
        let held = range.len() as u64;
        self.huge
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(range);
        held
    }

    /// [`ByteSource::read_ahead`] of a mapped file: read-ahead of the range
    /// unless it is resident or in a huge-page range (left to its faults),
    /// whatever the fetch-ahead gate says.
    pub fn read_ahead(&self, map: &memmap2::Mmap, offset: u64, length: usize) {
        let end = offset.saturating_add(length as u64).min(map.len() as u64);
        if offset >= end || self.is_huge(offset, length) || is_resident(map, offset, end) {
            return;
        }
        let _ = map.advise_range(
            memmap2::Advice::WillNeed,
            offset as usize,
            (end - offset) as usize,
        );
    }

    /// Fetch-ahead of `ranges` (see [`ByteSource::fetch_ahead`]): ranges in a
    /// huge-page range are left to the faults of the reads that follow;
    /// others are read ahead while the file misses pages.
    pub fn fetch_ahead(&self, map: &memmap2::Mmap, ranges: &[(u64, usize)]) {
        self.read_ahead
            .fetch_ahead_where(map, ranges, |offset, length| !self.is_huge(offset, length));
    }

    /// Brings `offset..end` of `map` into memory now: the parts in huge-page
    /// ranges by faulting them in (`MADV_POPULATE_READ`, which blocks until
    /// they are read), the rest in the background (`MADV_WILLNEED`).
    pub fn warm(&self, map: &memmap2::Mmap, offset: u64, end: u64) {
        let (start, end) = (offset as usize, (end as usize).min(map.len()));
        if start >= end {
            return;
        }
        let huge = self.huge.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut cursor = start;
        let mut pieces = huge
            .iter()
            .filter_map(|range| {
                let (from, to) = (range.start.max(start), range.end.min(end));
                (from < to).then_some(from..to)
            })
            .collect::<Vec<_>>();
        pieces.sort_by_key(|piece| piece.start);
        for piece in pieces {
            if cursor < piece.start {
                let _ = map.advise_range(memmap2::Advice::WillNeed, cursor, piece.start - cursor);
            }
            let from = piece.start.max(cursor);
            if from < piece.end {
                let _ = map.advise_range(memmap2::Advice::PopulateRead, from, piece.end - from);
            }
            cursor = cursor.max(piece.end);
        }
        if cursor < end {
            let _ = map.advise_range(memmap2::Advice::WillNeed, cursor, end - cursor);
        }
    }

    /// Tells whether `offset..offset + length` lies in a huge-page range.
    pub fn is_huge(&self, offset: u64, length: usize) -> bool {
        overlaps(
            &self.huge.lock().unwrap_or_else(|p| p.into_inner()),
            offset as usize,
            length,
        )
    }
}

/// Whether `offset..offset + length` overlaps any of `ranges`.
fn overlaps(ranges: &[std::ops::Range<usize>], offset: usize, length: usize) -> bool {
    let end = offset.saturating_add(length.max(1));
    ranges
        .iter()
        .any(|range| range.start < end && offset < range.end)
}

/// Tells whether every page of `offset..end` (within `map`) is in memory;
/// false when the kernel cannot say.
fn is_resident(map: &memmap2::Mmap, offset: u64, end: u64) -> bool {
    let page = rustix::param::page_size();
    let base = map.as_ptr() as usize;
    let mut start = (base + offset as usize) & !(page - 1);
    let stop = base + end as usize;
    let mut pages = [0u8; 16];
    while start < stop {
        let count = (stop - start).div_ceil(page).min(pages.len());
        // SAFETY: `start..start + count * page` lies within the mapping's pages
        // (a mapping covers whole pages, and `start` is page-aligned at or after
        // its base, before `stop`); `mincore` only reads the page tables and the
        // page cache, writing one byte per page into `pages`, which has `count`.
        let status = unsafe {
            libc::mincore(
                start as *mut libc::c_void,
                count * page,
                pages.as_mut_ptr().cast(),
            )
        };
        if status != 0 || pages[..count].iter().any(|byte| byte & 1 == 0) {
            return false;
        }
        start += count * page;
    }
    true
}

/// A segment file on local disk, memory-mapped read-only.
pub struct MmapSource {
    name: String,
    map: memmap2::Mmap,
    advice: MappedAdvice,
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
        Ok(MmapSource {
            name,
            advice: MappedAdvice::of_map(&map),
            map,
        })
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
        Ok(MmapSource {
            name,
            advice: MappedAdvice::of_map(&map),
            map,
        })
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
        self.advice.fetch_ahead(&self.map, ranges);
    }

    fn read_ahead(&self, offset: u64, length: usize) {
        self.advice.read_ahead(&self.map, offset, length);
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn advise(&self, offset: u64, length: usize, pattern: AccessPattern) {
        self.advice.advise(&self.map, offset, length, pattern);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn map(file: &std::fs::File) -> memmap2::Mmap {
        // SAFETY: the test's file is not changed while mapped.
        unsafe { memmap2::Mmap::map(file) }.expect("map")
    }

    #[test]
    fn read_ahead_leaves_resident_pages_alone_and_goes_quiet() {
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(&vec![7u8; 64 << 10]).expect("write");
        let map = map(&file);
        // Touch every page: all resident.
        assert_eq!(
            map.iter().map(|&byte| byte as u64).sum::<u64>(),
            7 * (64 << 10)
        );
        let gate = ReadAhead::new();
        let ranges = [(0u64, 3000usize), (10_000, 3000), (60_000, 10_000)];
        for _ in 0..ReadAhead::QUIET_CALLS {
            assert!(gate.is_looking());
            assert_eq!(gate.fetch_ahead(&map, &ranges), 0);
        }
        assert!(
            !gate.is_looking(),
            "quiet after calls that found everything"
        );
        // Quiet: the next calls are not even checked, except one in SAMPLE_EVERY.
        for _ in 0..3 * ReadAhead::SAMPLE_EVERY {
            assert_eq!(gate.fetch_ahead(&map, &ranges), 0);
        }
    }

    #[test]
    fn read_ahead_advises_missing_pages_and_wakes_up_on_a_miss() {
        // A sparse file: its holes are in no page cache until read.
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(64 << 20).expect("set_len");
        let map = map(&file);
        let gate = ReadAhead::new();
        assert_eq!(gate.fetch_ahead(&map, &[(0, 4096), (8 << 20, 3000)]), 2);
        assert!(gate.is_looking());
        // Bring a small range in and let the gate go quiet on it.
        let small = [(100u64, 100usize)];
        assert_eq!(map[100..200].iter().map(|&b| b as u32).sum::<u32>(), 0);
        for _ in 0..ReadAhead::QUIET_CALLS {
            gate.fetch_ahead(&map, &small);
        }
        assert!(!gate.is_looking());
        // A sampled call that misses turns it back on. Pages far apart stay out
        // of the kernel's readahead window of the earlier reads.
        let cold: Vec<(u64, usize)> = (1..40u64).map(|i| (i << 20 | 0x8000, 3000)).collect();
        let advised = (0..ReadAhead::SAMPLE_EVERY)
            .map(|_| gate.fetch_ahead(&map, &cold))
            .find(|&advised| advised > 0);
        assert!(advised.is_some(), "a sampled call saw the missing pages");
        assert!(gate.is_looking(), "looking again after a miss");
        // Ranges past the end are cut, not advised.
        assert_eq!(gate.fetch_ahead(&map, &[(64 << 20, 4096)]), 0);
    }
}
