//! Writing large files around the page cache.
//!
//! A build writes its segment — gigabytes for a large merge — in aligned 2 MiB
//! chunks, so that the page cache holds it in 2 MiB folios and it is mapped with
//! huge pages. Through the page cache each of those folios is first filled by
//! the CPU; on a virtual machine whose host takes back the guest's free memory
//! (free page reporting, ballooning) that is a fault on the host for every page
//! as well: measured on the 2-vCPU nested guest the project runs on, `dd` of
//! 1 GB in 2 MiB writes into a new file took 5–10 s of system time buffered and
//! 0.1 s with `O_DIRECT`, and reading it back cold through a `MADV_HUGEPAGE`
//! mapping 0.9 s, with 2 MiB folios the device filled (smaller buffered writes,
//! such as the build's 1 MiB scratch writes, were cheap). A 1M × 768 merge
//! spent half its time there (docs/bench/served-real100k/calibrated-300/
//! experiments.txt, items 48 and 49).
//!
//! [`DirectFileWriter`] writes whole, aligned [`HUGE_PAGE_BYTES`] chunks from a
//! page-aligned buffer with `O_DIRECT` where the file system takes it, and the
//! same chunks through the page cache where it does not (tmpfs on older
//! kernels, some network file systems): those make 2 MiB folios too.
//! [`map_read_back`] maps a finished file so that reading it fills the page
//! cache with 2 MiB folios (the device's work, not the CPU's).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};

use crate::huge_pages::HUGE_PAGE_BYTES;

/// What the offset, length and memory of a direct write are aligned to: the
/// page size, a multiple of every block device's logical block size in use.
const DIRECT_ALIGN: usize = 4096;

/// A writer of a new file (positioned at its start) in aligned 2 MiB chunks,
/// around the page cache when it can (see the module's text). What it was given
/// is in the file once [`DirectFileWriter::finish`] returns; `flush` keeps a
/// partial chunk buffered.
pub struct DirectFileWriter {
    file: File,
    /// Page-aligned (an anonymous mapping), [`HUGE_PAGE_BYTES`] long.
    buffer: memmap2::MmapMut,
    filled: usize,
    /// Bytes in the file so far (whole chunks).
    written: u64,
    direct: bool,
}

impl DirectFileWriter {
    /// Wraps `file` (new and empty), writing with `O_DIRECT` if its file
    /// system accepts the flag.
    pub fn new(file: File) -> io::Result<Self> {
        let buffer = memmap2::MmapMut::map_anon(HUGE_PAGE_BYTES)?;
        let direct = set_direct(&file, true).is_ok();
        Ok(DirectFileWriter {
            file,
            buffer,
            filled: 0,
            written: 0,
            direct,
        })
    }

    /// Wraps `file` writing through the page cache (the same aligned chunks).
    pub fn buffered(file: File) -> io::Result<Self> {
        let mut writer = DirectFileWriter::new(file)?;
        writer.stop_direct()?;
        Ok(writer)
    }

    /// Tells whether the writes still go around the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Writes what is buffered and returns the file, `O_DIRECT` cleared, with
    /// exactly the bytes written to it.
    pub fn finish(mut self) -> io::Result<File> {
        if self.filled > 0 {
            let length = self.filled;
            if self.direct {
                // A direct write's length is aligned too: pad, then cut the
                // file back to its length.
                let padded = length.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
                self.buffer[length..padded].fill(0);
                self.write_chunk(padded)?;
                self.file.set_len(self.written - (padded - length) as u64)?;
            } else {
                self.write_chunk(length)?;
            }
        }
        if self.direct {
            self.stop_direct()?;
        }
        Ok(self.file)
    }

    /// Writes the buffer's first `length` bytes at the end of the file.
    fn write_chunk(&mut self, length: usize) -> io::Result<()> {
        match self.file.write_all_at(&self.buffer[..length], self.written) {
            Ok(()) => {}
            // The flag was taken but the file system refuses direct writes
            // (or this alignment): the same chunk through the page cache.
            Err(error) if self.direct && error.kind() == io::ErrorKind::InvalidInput => {
                self.stop_direct()?;
                self.file
                    .write_all_at(&self.buffer[..length], self.written)?;
            }
            Err(error) => return Err(error),
        }
        self.written += length as u64;
        self.filled = 0;
        Ok(())
    }

    fn stop_direct(&mut self) -> io::Result<()> {
        set_direct(&self.file, false)?;
        self.direct = false;
        Ok(())
    }
}

impl Write for DirectFileWriter {
    fn write(&mut self, mut data: &[u8]) -> io::Result<usize> {
        let length = data.len();
        while !data.is_empty() {
            let take = (HUGE_PAGE_BYTES - self.filled).min(data.len());
            self.buffer[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == HUGE_PAGE_BYTES {
                self.write_chunk(HUGE_PAGE_BYTES)?;
            }
        }
        Ok(length)
    }

    /// Keeps a partial chunk buffered (a direct write of it would break the
    /// alignment of the next); [`DirectFileWriter::finish`] writes it.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Maps a finished file and reads it into the page cache in 2 MiB folios: a
/// fault of a `MADV_HUGEPAGE` mapping reads one (the device fills it), and
/// `MADV_POPULATE_READ` faults the whole file at once. Do it before anything
/// else reads the file — a read through a mapping without the advice, or with
/// `read`, makes small folios, and the file is then mapped with 4 KiB pages.
/// Older kernels refuse an advice, which changes nothing but the page size.
pub fn map_read_back(file: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: the caller's file is finished; nothing writes to it while mapped.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    let _ = map.advise(memmap2::Advice::HugePage);
    let _ = map.advise(memmap2::Advice::PopulateRead);
    Ok(map)
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let flags = fcntl_getfl(file)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    fcntl_setfl(file, flags)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn pattern(length: usize) -> Vec<u8> {
        (0..length)
            .map(|index| (index * 7 + index / 4099) as u8)
            .collect()
    }

    fn read_back(mut file: File) -> Vec<u8> {
        use std::io::Seek;
        file.rewind().unwrap();
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_file_written_around_the_page_cache_holds_exactly_its_bytes() {
        let directory = tempfile::tempdir().unwrap();
        // Whole chunks, a partial one, unaligned tails, nothing.
        for length in [
            0,
            1,
            4095,
            4097,
            HUGE_PAGE_BYTES,
            HUGE_PAGE_BYTES + 12_345,
            3 * HUGE_PAGE_BYTES - 1,
        ] {
            let bytes = pattern(length);
            for direct in [true, false] {
                let file = tempfile::tempfile_in(directory.path()).unwrap();
                let mut writer = if direct {
                    DirectFileWriter::new(file).unwrap()
                } else {
                    DirectFileWriter::buffered(file).unwrap()
                };
                assert!(direct || !writer.is_direct());
                // In pieces of an odd size, with flushes between them.
                for piece in bytes.chunks(777_777) {
                    writer.write_all(piece).unwrap();
                    writer.flush().unwrap();
                }
                let file = writer.finish().unwrap();
                assert!(!fcntl_getfl(&file).unwrap().contains(OFlags::DIRECT));
                assert_eq!(file.metadata().unwrap().len(), length as u64);
                assert!(read_back(file) == bytes, "{length} bytes, direct {direct}");
            }
        }
    }

    #[test]
    fn the_writes_go_around_the_page_cache_where_the_file_system_allows() {
        // The test directory's file system (ext4 or xfs on Linux CI) takes
        // O_DIRECT; the writer must use it there, and what it wrote must not
        // sit in the page cache.
        let directory = tempfile::tempdir().unwrap();
        let file = tempfile::tempfile_in(directory.path()).unwrap();
        let mut writer = DirectFileWriter::new(file).unwrap();
        if !writer.is_direct() {
            let probe = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags_direct()
                .open(directory.path().join("probe"));
            assert!(
                probe.is_err(),
                "the file system takes O_DIRECT but the writer did not use it"
            );
            return;
        }
        writer.write_all(&pattern(4 * HUGE_PAGE_BYTES)).unwrap();
        assert!(writer.is_direct());
        let file = writer.finish().unwrap();
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let pages = map.len() / 4096;
        let mut resident = vec![0u8; pages];
        // SAFETY: a live mapping of `map.len()` bytes and a vector of one byte
        // per page.
        let status = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                resident.as_mut_ptr(),
            )
        };
        assert_eq!(status, 0);
        let cached = resident.iter().filter(|page| **page & 1 != 0).count();
        assert!(cached < pages / 4, "{cached} of {pages} pages cached");
        assert!(map[..] == pattern(4 * HUGE_PAGE_BYTES)[..]);
    }

    trait DirectOpen {
        fn custom_flags_direct(&mut self) -> &mut Self;
    }

    impl DirectOpen for std::fs::OpenOptions {
        fn custom_flags_direct(&mut self) -> &mut Self {
            use std::os::unix::fs::OpenOptionsExt;
            self.custom_flags(libc::O_DIRECT)
        }
    }
}
