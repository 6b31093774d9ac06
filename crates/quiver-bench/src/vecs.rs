//! `.fvecs` / `.ivecs` files: per vector, a little-endian i32 dimension, then the
//! values (f32 or i32).

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// A dense row-major matrix read from a vecs file.
pub struct Matrix<T> {
    pub dim: usize,
    pub data: Vec<T>,
}

impl<T> Matrix<T> {
    /// Returns the number of rows.
    pub fn rows(&self) -> usize {
        self.data.len() / self.dim.max(1)
    }

    /// Returns row `index`.
    pub fn row(&self, index: usize) -> &[T] {
        &self.data[index * self.dim..][..self.dim]
    }
}

fn read_vecs<T: bytemuck::Pod>(path: &Path, max_rows: Option<usize>) -> Result<Matrix<T>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() < 4 {
        bail!("{} is empty", path.display());
    }
    let dim = i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if dim <= 0 {
        bail!("{}: first vector has dimension {dim}", path.display());
    }
    let dim = dim as usize;
    let record = 4 * (dim + 1);
    if bytes.len() % record != 0 {
        bail!(
            "{}: size {} is not a multiple of 4·(1 + {dim})",
            path.display(),
            bytes.len()
        );
    }
    let rows = (bytes.len() / record).min(max_rows.unwrap_or(usize::MAX));
    let mut data = Vec::with_capacity(rows * dim);
    for (row, chunk) in bytes.chunks_exact(record).take(rows).enumerate() {
        let row_dim = i32::from_le_bytes(chunk[..4].try_into().expect("4 bytes"));
        if row_dim as usize != dim {
            bail!(
                "{}: vector {row} has dimension {row_dim}, the first has {dim}",
                path.display()
            );
        }
        data.extend_from_slice(&bytemuck::pod_collect_to_vec::<u8, T>(&chunk[4..]));
    }
    Ok(Matrix { dim, data })
}

/// Reads an `.fvecs` file (at most `max_rows` rows).
pub fn read_fvecs(path: &Path, max_rows: Option<usize>) -> Result<Matrix<f32>> {
    read_vecs(path, max_rows)
}

/// Reads an `.ivecs` file (at most `max_rows` rows).
pub fn read_ivecs(path: &Path, max_rows: Option<usize>) -> Result<Matrix<i32>> {
    read_vecs(path, max_rows)
}

fn write_vecs<T: bytemuck::Pod>(path: &Path, dim: usize, data: &[T]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for row in data.chunks_exact(dim) {
        out.write_all(&(dim as i32).to_le_bytes())?;
        out.write_all(bytemuck::cast_slice(row))?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes `data` (rows of `dim`) as an `.fvecs` file.
pub fn write_fvecs(path: &Path, dim: usize, data: &[f32]) -> Result<()> {
    write_vecs(path, dim, data)
}

/// Writes `data` (rows of `dim`) as an `.ivecs` file.
pub fn write_ivecs(path: &Path, dim: usize, data: &[i32]) -> Result<()> {
    write_vecs(path, dim, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_files() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("a.fvecs");
        let data: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
        write_fvecs(&path, 3, &data).unwrap();
        let matrix = read_fvecs(&path, None).unwrap();
        assert_eq!((matrix.dim, matrix.rows()), (3, 4));
        assert_eq!(matrix.data, data);
        assert_eq!(read_fvecs(&path, Some(2)).unwrap().rows(), 2);
        let ints = directory.path().join("a.ivecs");
        write_ivecs(&ints, 2, &[1, 2, 3, 4]).unwrap();
        assert_eq!(read_ivecs(&ints, None).unwrap().data, vec![1, 2, 3, 4]);
        std::fs::write(&path, [3, 0, 0, 0, 1, 2]).unwrap();
        let error = read_fvecs(&path, None).err().unwrap().to_string();
        assert!(error.contains("not a multiple"), "{error}");
    }
}
