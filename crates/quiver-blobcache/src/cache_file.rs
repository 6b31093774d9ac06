//! The cache file: one preallocated file on local disk, mapped once and cut into
//! fixed-size regions. Its blocks are reserved when it is created, so a disk that
//! fills up later never fails a region write (a write into a mapping with no
//! block behind it is a SIGBUS, not an error). The cache starts empty on every
//! start: the file is scratch space, removed when the cache is dropped.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use quiver_index::AccessPattern;
use rustix::fs::FallocateFlags;
use rustix::io::Errno;

use crate::error::{CacheError, CacheResult};

/// Name of the cache file inside the cache directory.
pub(crate) const CACHE_FILE_NAME: &str = "quiver-region-cache.bin";
/// Name of the row tier's cache file inside the cache directory.
pub(crate) const ROW_CACHE_FILE_NAME: &str = "quiver-row-cache.bin";

/// The mapped cache file.
pub(crate) struct CacheFile {
    path: PathBuf,
    /// Fills are written through the file, not the mapping (see
    /// [`CacheFile::write_region`]).
    file: File,
    map: memmap2::MmapRaw,
}

impl CacheFile {
    /// Creates the file at `path` with `bytes` reserved on disk and maps it.
    pub(crate) fn create(path: PathBuf, bytes: u64) -> CacheResult<CacheFile> {
        let file = create_reserved(&path, bytes)?;
        // Read-only: the cache writes its regions through the file.
        let map = memmap2::MmapOptions::new()
            .map_raw_read_only(&file)
            .map_err(|source| CacheError::CacheFile {
                path: path.clone(),
                source,
            })?;
        Ok(CacheFile { path, file, map })
    }

    /// Writes a fill's `bytes` at the start of region `slot` with `pwrite`, not
    /// by copying into the mapping: a store into a mapped page the cache has not
    /// written yet faults, and the fault reads the page — and the kernel's read
    /// around it — from disk (zeros for the file's reserved blocks) only for the
    /// copy to overwrite them. Measured with a searcher whose cache was a quarter of
    /// the data inside a memory cgroup: that zeroing was 22 % of its CPU. A write
    /// of whole pages goes straight into the page cache, which the mapping shares,
    /// so readers see the bytes through the mapping as before.
    pub(crate) fn write_region(
        &self,
        slot: usize,
        region_bytes: usize,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        debug_assert!(bytes.len() <= region_bytes);
        self.file.write_all_at(bytes, (slot * region_bytes) as u64)
    }

    /// Returns the file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Returns the first byte of region `slot` (of `region_bytes` each).
    #[inline]
    pub(crate) fn region_pointer(&self, slot: usize, region_bytes: usize) -> *const u8 {
        debug_assert!((slot + 1) * region_bytes <= self.map.len());
        // SAFETY: every slot index is below the number of regions the file was
        // created with, so the offset stays inside the mapping.
        unsafe { self.map.as_ptr().add(slot * region_bytes) }
    }

    /// Advises the kernel how region `slot` will be read (a hint; failing to give
    /// it changes nothing).
    pub(crate) fn advise_region(&self, slot: usize, region_bytes: usize, pattern: AccessPattern) {
        let advice = match pattern {
            AccessPattern::Sequential => memmap2::Advice::WillNeed,
            AccessPattern::Random => memmap2::Advice::Random,
        };
        let _ = self
            .map
            .advise_range(advice, slot * region_bytes, region_bytes);
    }
}

impl Drop for CacheFile {
    fn drop(&mut self) {
        // The cache starts empty on every start: the file is scratch space.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Creates the cache file and reserves its blocks, so a full disk is an error now
/// rather than a crash (SIGBUS) when a region is first written. Nothing half-made
/// stays behind when it fails.
fn create_reserved(path: &Path, bytes: u64) -> CacheResult<File> {
    let io = |error: std::io::Error| CacheError::CacheFile {
        path: path.to_path_buf(),
        source: error,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    if let Err(error) = reserve(&file, bytes) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(io(error));
    }
    Ok(file)
}

/// Reserves `bytes` of disk for `file` (what `posix_fallocate` does): one
/// `fallocate`, or, on a file system without it, a zero written into every block.
fn reserve(file: &File, bytes: u64) -> std::io::Result<()> {
    match rustix::fs::fallocate(file, FallocateFlags::empty(), 0, bytes) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => write_every_block(file, bytes),
        Err(errno) => Err(errno.into()),
    }
}

/// Allocates every block of a freshly truncated (all-zero) file by writing a zero
/// into it, the last byte included.
fn write_every_block(file: &File, bytes: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    const BLOCK_BYTES: u64 = 4096;
    let mut offset = 0;
    while offset < bytes {
        file.write_all_at(&[0], offset)?;
        offset += BLOCK_BYTES;
    }
    if bytes > 0 {
        file.write_all_at(&[0], bytes - 1)?;
    }
    Ok(())
}

/// Tells whether a cache-file error means the disk (or quota) is full.
pub(crate) fn is_out_of_space(error: &CacheError) -> bool {
    let CacheError::CacheFile { source, .. } = error else {
        return false;
    };
    matches!(
        Errno::from_io_error(source),
        Some(Errno::NOSPC | Errno::DQUOT | Errno::FBIG)
    ) || source.kind() == std::io::ErrorKind::StorageFull
}

/// Returns the bytes a cache file in `directory` may take: `percent` of the space
/// free on its file system, counting a cache file left there (by a crash; it is
/// recreated on start) as free. The directory is created if missing.
pub(crate) fn share_of_free_space(directory: &Path, percent: u8) -> std::io::Result<u64> {
    std::fs::create_dir_all(directory)?;
    let stats = rustix::fs::statvfs(directory)?;
    let available = stats.f_bavail.saturating_mul(stats.f_frsize);
    let stale: u64 = [CACHE_FILE_NAME, ROW_CACHE_FILE_NAME]
        .iter()
        .map(|name| std::fs::metadata(directory.join(name)).map_or(0, |meta| meta.len()))
        .sum();
    Ok((available.saturating_add(stale) / 100).saturating_mul(u64::from(percent.min(100))))
}
