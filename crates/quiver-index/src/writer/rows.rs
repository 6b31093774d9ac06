//! Where a [`SegmentWriter`](super::SegmentWriter) keeps the rows it was given
//! until it builds: in memory, or appended to unnamed scratch files that the
//! build maps back. A spilled build of millions of rows then holds little
//! anonymous memory: the kernel pages the mapped rows in and out of its page
//! cache as the build reads them, and drops the files when the build is done.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bytemuck::Pod;

use crate::error::{IndexError, IndexResult};

/// Buffer of each scratch file's writer.
const SPILL_BUFFER_BYTES: usize = 1 << 20;

/// The rows' vectors (as stored: normalised for cosine) and payload bytes.
pub(super) struct RowStore {
    vectors: Column<f32>,
    payloads: Column<u8>,
    /// End offset of each row's payload in `payloads` (empty = no payload).
    payload_ends: Vec<u64>,
}

/// Values appended row by row, in memory or in a scratch file.
enum Column<T> {
    Memory(Vec<T>),
    Spilled {
        file: BufWriter<File>,
        directory: PathBuf,
    },
}

/// The rows once every one was added, readable as slices.
pub(super) struct FrozenRows {
    vectors: Frozen<f32>,
    payloads: Frozen<u8>,
    payload_ends: Vec<u64>,
}

enum Frozen<T> {
    Memory(Vec<T>),
    /// `None` for an empty file (which cannot be mapped).
    Mapped(Option<memmap2::Mmap>),
}

fn scratch_error(directory: &Path, source: std::io::Error) -> IndexError {
    IndexError::Scratch {
        directory: directory.display().to_string(),
        source,
    }
}

impl<T: Pod> Column<T> {
    fn spilled(directory: &Path) -> IndexResult<Self> {
        let file =
            tempfile::tempfile_in(directory).map_err(|source| scratch_error(directory, source))?;
        Ok(Column::Spilled {
            file: BufWriter::with_capacity(SPILL_BUFFER_BYTES, file),
            directory: directory.to_path_buf(),
        })
    }

    fn push(&mut self, values: &[T]) -> IndexResult<()> {
        match self {
            Column::Memory(held) => {
                held.extend_from_slice(values);
                Ok(())
            }
            Column::Spilled { file, directory } => file
                .write_all(bytemuck::cast_slice(values))
                .map_err(|source| scratch_error(directory, source)),
        }
    }

    fn freeze(self) -> IndexResult<Frozen<T>> {
        match self {
            Column::Memory(held) => Ok(Frozen::Memory(held)),
            Column::Spilled { file, directory } => {
                let file = file
                    .into_inner()
                    .map_err(|error| scratch_error(&directory, error.into_error()))?;
                let length = file
                    .metadata()
                    .map_err(|source| scratch_error(&directory, source))?
                    .len();
                if length == 0 {
                    return Ok(Frozen::Mapped(None));
                }
                // SAFETY: the file is unnamed (no other process can open it)
                // and this column no longer writes to it, so the mapped bytes
                // do not change while the map lives.
                let map = unsafe { memmap2::Mmap::map(&file) }
                    .map_err(|source| scratch_error(&directory, source))?;
                Ok(Frozen::Mapped(Some(map)))
            }
        }
    }
}

impl<T: Pod> Frozen<T> {
    fn as_slice(&self) -> &[T] {
        match self {
            Frozen::Memory(held) => held,
            // A page-aligned map of whole values: the cast cannot fail.
            Frozen::Mapped(Some(map)) => bytemuck::cast_slice(map),
            Frozen::Mapped(None) => &[],
        }
    }
}

impl RowStore {
    /// Rows held in memory.
    pub fn in_memory() -> Self {
        RowStore {
            vectors: Column::Memory(Vec::new()),
            payloads: Column::Memory(Vec::new()),
            payload_ends: Vec::new(),
        }
    }

    /// Rows appended to scratch files in `directory`.
    pub fn spilled(directory: &Path) -> IndexResult<Self> {
        Ok(RowStore {
            vectors: Column::spilled(directory)?,
            payloads: Column::spilled(directory)?,
            payload_ends: Vec::new(),
        })
    }

    /// Appends one row. On an error the store is left with a partial row;
    /// the writer refuses to build from it.
    pub fn push(&mut self, vector: &[f32], payload: Option<&[u8]>) -> IndexResult<()> {
        self.vectors.push(vector)?;
        let payload = payload.unwrap_or_default();
        self.payloads.push(payload)?;
        let end = self.payload_ends.last().copied().unwrap_or(0) + payload.len() as u64;
        self.payload_ends.push(end);
        Ok(())
    }

    /// Ends the adding; the rows become readable.
    pub fn freeze(self) -> IndexResult<FrozenRows> {
        Ok(FrozenRows {
            vectors: self.vectors.freeze()?,
            payloads: self.payloads.freeze()?,
            payload_ends: self.payload_ends,
        })
    }
}

impl FrozenRows {
    /// Every row's vector, row after row.
    pub fn vectors(&self) -> &[f32] {
        self.vectors.as_slice()
    }

    /// Row `row`'s payload bytes (empty when it has none).
    pub fn payload(&self, row: usize) -> &[u8] {
        let start = if row == 0 {
            0
        } else {
            self.payload_ends[row - 1]
        };
        &self.payloads.as_slice()[start as usize..self.payload_ends[row] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(mut store: RowStore) -> FrozenRows {
        store.push(&[1.0, 2.0], Some(b"{\"a\":1}")).unwrap();
        store.push(&[3.0, 4.0], None).unwrap();
        store.push(&[5.0, 6.0], Some(b"{}")).unwrap();
        store.freeze().unwrap()
    }

    #[test]
    fn spilled_rows_read_back_like_rows_in_memory() {
        let directory = tempfile::tempdir().unwrap();
        let memory = fill(RowStore::in_memory());
        let spilled = fill(RowStore::spilled(directory.path()).unwrap());
        for rows in [&memory, &spilled] {
            assert_eq!(rows.vectors(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            assert_eq!(rows.payload(0), b"{\"a\":1}");
            assert_eq!(rows.payload(1), b"");
            assert_eq!(rows.payload(2), b"{}");
        }
        // The scratch files are unnamed: nothing is left in the directory.
        assert_eq!(std::fs::read_dir(directory.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_empty_spilled_store_freezes() {
        let directory = tempfile::tempdir().unwrap();
        let rows = RowStore::spilled(directory.path())
            .unwrap()
            .freeze()
            .unwrap();
        assert!(rows.vectors().is_empty());
    }

    #[test]
    fn a_missing_scratch_directory_is_named() {
        let error = RowStore::spilled(Path::new("/nonexistent/quiver-scratch"))
            .err()
            .unwrap();
        assert!(
            error.to_string().contains("/nonexistent/quiver-scratch"),
            "{error}"
        );
    }
}
