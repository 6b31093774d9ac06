//! `.fvecs` / `.ivecs` files, the usual format of vector benchmark datasets: per
//! vector, a little-endian `i32` dimension, then that many little-endian values
//! (`f32` or `i32`). Every vector of a file has the same dimension.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The largest dimension a file may declare: the largest a collection takes.
/// A larger (or negative) one means the file is not a vecs file.
pub const MAX_DIMENSION: usize = 65_536;

/// What went wrong reading or writing a vecs file; every error names the file.
#[derive(Debug, thiserror::Error)]
pub enum VecsError {
    /// The file could not be read or written.
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file's bytes are not a vecs file.
    #[error("{path} is not a vecs file: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// The result of reading or writing a vecs file.
pub type VecsResult<T> = Result<T, VecsError>;

/// A value a vecs file holds: `f32` (`.fvecs`) or `i32` (`.ivecs`).
pub trait VecsValue: Copy {
    /// Returns the value of its four little-endian bytes.
    fn from_le_bytes(bytes: [u8; 4]) -> Self;
    /// Returns the value's four little-endian bytes.
    fn to_le_bytes(self) -> [u8; 4];
}

impl VecsValue for f32 {
    fn from_le_bytes(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }

    fn to_le_bytes(self) -> [u8; 4] {
        f32::to_le_bytes(self)
    }
}

impl VecsValue for i32 {
    fn from_le_bytes(bytes: [u8; 4]) -> Self {
        i32::from_le_bytes(bytes)
    }

    fn to_le_bytes(self) -> [u8; 4] {
        i32::to_le_bytes(self)
    }
}

/// A dense row-major matrix read from a vecs file.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix<T> {
    /// The dimension of every row.
    pub dim: usize,
    /// The rows, one after the other.
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

fn four_bytes(bytes: &[u8]) -> [u8; 4] {
    bytes[..4].try_into().expect("four bytes")
}

/// Returns the dimension a record header declares, checked: between 1 and
/// [`MAX_DIMENSION`].
fn dimension_of(path: &Path, header: [u8; 4], row: usize) -> VecsResult<usize> {
    let declared = i32::from_le_bytes(header);
    match usize::try_from(declared) {
        Ok(dim) if (1..=MAX_DIMENSION).contains(&dim) => Ok(dim),
        _ => Err(VecsError::Format {
            path: path.to_path_buf(),
            reason: format!(
                "vector {row} declares dimension {declared}, not between 1 and {MAX_DIMENSION}"
            ),
        }),
    }
}

/// Parses the bytes of a vecs file (at most `max_rows` rows); `path` names it in errors.
pub fn parse_vecs<T: VecsValue>(
    path: &Path,
    bytes: &[u8],
    max_rows: Option<usize>,
) -> VecsResult<Matrix<T>> {
    let format = |reason: String| VecsError::Format {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 4 {
        return Err(format(format!(
            "{} bytes, shorter than one header",
            bytes.len()
        )));
    }
    let dim = dimension_of(path, four_bytes(bytes), 0)?;
    let record = 4 * (dim + 1);
    if !bytes.len().is_multiple_of(record) {
        return Err(format(format!(
            "size {} is not a multiple of 4·(1 + {dim})",
            bytes.len()
        )));
    }
    let rows = (bytes.len() / record).min(max_rows.unwrap_or(usize::MAX));
    let mut data = Vec::with_capacity(rows * dim);
    for (row, chunk) in bytes.chunks_exact(record).take(rows).enumerate() {
        let row_dim = dimension_of(path, four_bytes(chunk), row)?;
        if row_dim != dim {
            return Err(format(format!(
                "vector {row} has dimension {row_dim}, the first has {dim}"
            )));
        }
        data.extend(
            chunk[4..]
                .chunks_exact(4)
                .map(|value| T::from_le_bytes(four_bytes(value))),
        );
    }
    Ok(Matrix { dim, data })
}

fn read_vecs<T: VecsValue>(path: &Path, max_rows: Option<usize>) -> VecsResult<Matrix<T>> {
    let bytes = std::fs::read(path).map_err(|source| VecsError::Io {
        operation: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    parse_vecs(path, &bytes, max_rows)
}

/// Reads an `.fvecs` file (at most `max_rows` rows).
pub fn read_fvecs(path: &Path, max_rows: Option<usize>) -> VecsResult<Matrix<f32>> {
    read_vecs(path, max_rows)
}

/// Reads an `.ivecs` file (at most `max_rows` rows).
pub fn read_ivecs(path: &Path, max_rows: Option<usize>) -> VecsResult<Matrix<i32>> {
    read_vecs(path, max_rows)
}

fn write_vecs<T: VecsValue>(path: &Path, dim: usize, data: &[T]) -> VecsResult<()> {
    let io_error = |source| VecsError::Io {
        operation: "writing",
        path: path.to_path_buf(),
        source,
    };
    let header = match i32::try_from(dim) {
        Ok(header) if (1..=MAX_DIMENSION).contains(&dim) => header.to_le_bytes(),
        _ => {
            return Err(VecsError::Format {
                path: path.to_path_buf(),
                reason: format!("dimension {dim} is not between 1 and {MAX_DIMENSION}"),
            });
        }
    };
    let file = std::fs::File::create(path).map_err(|source| VecsError::Io {
        operation: "creating",
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = BufWriter::new(file);
    for row in data.chunks_exact(dim) {
        out.write_all(&header).map_err(io_error)?;
        for value in row {
            out.write_all(&value.to_le_bytes()).map_err(io_error)?;
        }
    }
    out.flush().map_err(io_error)
}

/// Writes `data` (rows of `dim`) as an `.fvecs` file.
pub fn write_fvecs(path: &Path, dim: usize, data: &[f32]) -> VecsResult<()> {
    write_vecs(path, dim, data)
}

/// Writes `data` (rows of `dim`) as an `.ivecs` file.
pub fn write_ivecs(path: &Path, dim: usize, data: &[i32]) -> VecsResult<()> {
    write_vecs(path, dim, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dim: i32, values: &[f32]) -> Vec<u8> {
        let mut bytes = dim.to_le_bytes().to_vec();
        for value in values {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn round_trip_and_bad_files() {
        let directory = std::env::temp_dir().join(format!("quiver-vecs-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("a.fvecs");
        let data: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
        write_fvecs(&path, 3, &data).unwrap();
        let matrix = read_fvecs(&path, None).unwrap();
        assert_eq!((matrix.dim, matrix.rows()), (3, 4));
        assert_eq!(matrix.data, data);
        assert_eq!(matrix.row(1), &data[3..6]);
        assert_eq!(read_fvecs(&path, Some(2)).unwrap().rows(), 2);
        let ints = directory.join("a.ivecs");
        write_ivecs(&ints, 2, &[1, 2, 3, 4]).unwrap();
        assert_eq!(read_ivecs(&ints, None).unwrap().data, vec![1, 2, 3, 4]);
        std::fs::write(&path, [3, 0, 0, 0, 1, 2]).unwrap();
        let error = read_fvecs(&path, None).unwrap_err().to_string();
        assert!(error.contains("not a multiple"), "{error}");
        assert!(error.contains("a.fvecs"), "names the file: {error}");
        let missing = read_fvecs(&directory.join("missing.fvecs"), None).unwrap_err();
        assert!(missing.to_string().contains("missing.fvecs"), "{missing}");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn negative_absurd_and_mixed_dimensions_are_errors_naming_the_file() {
        let path = Path::new("data/queries.fvecs");
        for dim in [-3, 0, 1 << 20] {
            let bytes = record(dim, &[1.0; 4]);
            let error = parse_vecs::<f32>(path, &bytes, None)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("queries.fvecs") && error.contains(&format!("dimension {dim}")),
                "{error}"
            );
        }
        let mut mixed = record(2, &[1.0, 2.0]);
        mixed.extend(record(1, &[3.0, 4.0]));
        let error = parse_vecs::<f32>(path, &mixed, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("vector 1 has dimension 1"), "{error}");
        assert!(parse_vecs::<f32>(path, &[1, 0], None).is_err());
    }
}
