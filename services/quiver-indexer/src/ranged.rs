//! A segment read from the object store by ranges ([`RangedSource`]), for the
//! few sections a shard writer needs of each segment when it opens — the row ids
//! for its primary-key map, the codebook — without downloading the object: a
//! segment of a million 768-d rows is 3.3 GB, its ids 8 MB.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use quiver_index::{ByteSource, IndexError, IndexResult, ReadSession};
use quiver_storage::Storage;
use tokio::runtime::Handle;

/// Bytes fetched at a time: a read fetches the blocks under it it does not have.
const BLOCK_BYTES: u64 = 4 << 20;

/// Bytes in an 8-byte aligned buffer (sections are cast to `f32`/`u32`; a
/// response body has no alignment).
#[derive(Debug)]
struct Aligned {
    words: Vec<u64>,
    length: usize,
}

impl Aligned {
    fn copy_of(bytes: &[u8]) -> Aligned {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Aligned {
            words,
            length: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.length]
    }
}

/// One read of a [`RangedSource`]: a range of a fetched block, or a copy of a
/// range across blocks.
#[derive(Debug)]
pub(crate) struct RangedBytes {
    buffer: Arc<Aligned>,
    start: usize,
    length: usize,
}

impl Deref for RangedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buffer.bytes()[self.start..self.start + self.length]
    }
}

/// Reads one object of the store by ranged GETs, [`BLOCK_BYTES`] at a time,
/// keeping what it fetched for as long as it lives (it lives for one segment's
/// open; it is not a cache). Blocks on the runtime `runtime`: use it off the
/// runtime's threads (`spawn_blocking`).
pub(crate) struct RangedSource {
    storage: Storage,
    key: String,
    size: u64,
    runtime: Handle,
    blocks: Mutex<HashMap<u64, Arc<Aligned>>>,
    fetched: std::sync::atomic::AtomicU64,
}

impl RangedSource {
    /// A source over object `key` of `size` bytes.
    pub(crate) fn new(storage: Storage, key: &str, size: u64, runtime: Handle) -> Self {
        RangedSource {
            storage,
            key: key.to_string(),
            size,
            runtime,
            blocks: Mutex::new(HashMap::new()),
            fetched: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes fetched from the store so far.
    pub(crate) fn bytes_fetched(&self) -> u64 {
        self.fetched.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn io_error(&self, message: String) -> IndexError {
        IndexError::Io {
            object: self.key.clone(),
            source: std::io::Error::other(message),
        }
    }

    /// Fetches the blocks `first..=last` not held yet, in one ranged GET from
    /// the first missing to the last missing.
    fn ensure(&self, first: u64, last: u64) -> IndexResult<()> {
        let missing: Vec<u64> = {
            let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
            (first..=last)
                .filter(|block| !blocks.contains_key(block))
                .collect()
        };
        let (Some(&from), Some(&to)) = (missing.first(), missing.last()) else {
            return Ok(());
        };
        let start = from * BLOCK_BYTES;
        let end = ((to + 1) * BLOCK_BYTES).min(self.size);
        let bytes = self
            .runtime
            .block_on(self.storage.get_range(&self.key, start..end))
            .map_err(|error| self.io_error(error.to_string()))?;
        if bytes.len() as u64 != end - start {
            return Err(self.io_error(format!(
                "the store returned {} bytes for the {} bytes asked for",
                bytes.len(),
                end - start
            )));
        }
        self.fetched
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        for block in from..=to {
            let at = ((block - from) * BLOCK_BYTES) as usize;
            let until = (at + BLOCK_BYTES as usize).min(bytes.len());
            blocks
                .entry(block)
                .or_insert_with(|| Arc::new(Aligned::copy_of(&bytes[at..until])));
        }
        Ok(())
    }
}

impl ByteSource for RangedSource {
    type Bytes<'a> = RangedBytes;
    type Session<'a> = RangedSession<'a>;

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<RangedBytes> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| IndexError::Corrupted {
                object: self.key.clone(),
                reason: format!(
                    "read of {length} bytes at {offset} is past the end ({} bytes)",
                    self.size
                ),
            })?;
        if length == 0 {
            return Ok(RangedBytes {
                buffer: Arc::new(Aligned::copy_of(&[])),
                start: 0,
                length: 0,
            });
        }
        let (first, last) = (offset / BLOCK_BYTES, (end - 1) / BLOCK_BYTES);
        self.ensure(first, last)?;
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let block = |index: u64| blocks.get(&index).expect("fetched above").clone();
        if first == last {
            return Ok(RangedBytes {
                buffer: block(first),
                start: (offset - first * BLOCK_BYTES) as usize,
                length,
            });
        }
        let mut copied = Vec::with_capacity(length);
        for index in first..=last {
            let block_start = index * BLOCK_BYTES;
            let from = offset.max(block_start) - block_start;
            let to = end.min(block_start + BLOCK_BYTES) - block_start;
            copied.extend_from_slice(&block(index).bytes()[from as usize..to as usize]);
        }
        Ok(RangedBytes {
            buffer: Arc::new(Aligned::copy_of(&copied)),
            start: 0,
            length,
        })
    }

    fn name(&self) -> &str {
        &self.key
    }

    fn session(&self) -> RangedSession<'_> {
        RangedSession(self)
    }
}

/// Reads through a [`RangedSource`] (each read a copy: opening a shard does not
/// search).
pub(crate) struct RangedSession<'a>(&'a RangedSource);

impl ReadSession for RangedSession<'_> {
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Cow<'_, [u8]>> {
        ByteSource::read_at(self.0, offset, length).map(|bytes| Cow::Owned(bytes.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use quiver_storage::{S3Settings, StorageOptions, StoreUrl};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_come_back_whole_and_aligned_and_blocks_are_fetched_once() {
        let storage = Storage::open(
            &StoreUrl::Memory,
            &S3Settings::default(),
            StorageOptions::default(),
        )
        .unwrap();
        let size = (BLOCK_BYTES * 2 + 1000) as usize;
        let object: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        storage
            .put("seg", Bytes::from(object.clone()))
            .await
            .unwrap();
        let handle = Handle::current();
        tokio::task::spawn_blocking(move || {
            let source = RangedSource::new(storage, "seg", size as u64, handle);
            for (offset, length) in [
                (3u64, 100usize),
                (BLOCK_BYTES - 10, 20),
                (BLOCK_BYTES * 2, 1000),
            ] {
                let bytes = source.read_at(offset, length).unwrap();
                assert_eq!(&*bytes, &object[offset as usize..offset as usize + length]);
                if offset % 8 == 0 {
                    assert_eq!(
                        bytes.as_ptr() as usize % 8,
                        0,
                        "an aligned offset reads aligned bytes"
                    );
                }
            }
            // Every block once: the three reads touched all three.
            assert_eq!(source.bytes_fetched(), size as u64);
            let whole = source.read_at(0, size).unwrap();
            assert_eq!(&*whole, &object[..]);
            assert_eq!(source.bytes_fetched(), size as u64, "nothing fetched twice");
            assert!(source.read_at(size as u64 - 1, 2).is_err(), "past the end");
        })
        .await
        .unwrap();
    }
}
