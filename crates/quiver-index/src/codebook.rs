//! A shard's codebook: the rotation seed and the rotated IVF centroids that
//! several segments share.
//!
//! A segment built without a codebook trains its own centroids (k-means) and
//! becomes the source of a new codebook ([`Codebook::of_segment`]). A segment
//! built with one skips k-means: every row goes to its nearest shared centroid.
//! Segments of one codebook have the same lists, so a search ranks the
//! centroids once and probes the same lists of every segment against one top-k
//! ([`crate::search_shared`]): a shard answers at the cost of one segment
//! holding all its rows, however many flushes and merges made it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{IndexError, IndexResult};
use crate::reader::Segment;
use crate::rotation::padded_dimension;
use crate::source::ByteSource;

/// What a segment's header says about the codebook it was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodebookInfo {
    /// Identifies the codebook: a hash of its seed, dimension and centroids.
    /// Segments with equal ids have identical centroids and rotation.
    pub id: u64,
    /// Rows of the build that trained it (how much data it was sized for).
    pub trained_rows: u64,
}

/// The rotation seed and rotated centroids segments can be built with.
#[derive(Clone, PartialEq)]
pub struct Codebook {
    seed: u64,
    dim: usize,
    /// `nlist × padded_dim`, in the rotated space of the codes.
    rotated_centroids: Vec<f32>,
    info: CodebookInfo,
}

impl fmt::Debug for Codebook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codebook")
            .field("id", &format_args!("{:016x}", self.info.id))
            .field("dim", &self.dim)
            .field("nlist", &self.nlist())
            .field("trained_rows", &self.info.trained_rows)
            .finish()
    }
}

/// Returns the id of a codebook of `seed`, `dim` and `rotated_centroids`.
pub(crate) fn codebook_id(seed: u64, dim: usize, rotated_centroids: &[f32]) -> u64 {
    let mut hash = quiver_common::hash::fnv1a64(&seed.to_le_bytes());
    hash = quiver_common::hash::fnv1a64_extend(hash, &(dim as u64).to_le_bytes());
    hash = quiver_common::hash::fnv1a64_extend(hash, bytemuck::cast_slice(rotated_centroids));
    quiver_common::hash::mix64(hash)
}

impl Codebook {
    /// Returns the codebook `segment` was built with (the one it trained, or
    /// the one it was given), its centroids read from the segment's centroid
    /// section; `None` for segments written before codebooks.
    pub fn of_segment<S: ByteSource>(segment: &Segment<S>) -> IndexResult<Option<Codebook>> {
        let header = segment.header();
        let Some(info) = header.codebook else {
            return Ok(None);
        };
        Ok(Some(Codebook {
            seed: header.rotation_seed,
            dim: header.dim,
            rotated_centroids: segment.rotated_centroids()?,
            info,
        }))
    }

    /// Returns the header facts: id and trained rows.
    pub fn info(&self) -> CodebookInfo {
        self.info
    }

    /// Returns the id.
    pub fn id(&self) -> u64 {
        self.info.id
    }

    /// Returns the rows it was trained on.
    pub fn trained_rows(&self) -> u64 {
        self.info.trained_rows
    }

    /// Returns the number of lists.
    pub fn nlist(&self) -> usize {
        self.rotated_centroids.len() / padded_dimension(self.dim).max(1)
    }

    /// Returns the rotation seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Returns the vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn rotated_centroids(&self) -> &[f32] {
        &self.rotated_centroids
    }

    /// Checks that segments of dimension `dim` can be built with it.
    pub(crate) fn check_dim(&self, dim: usize) -> IndexResult<()> {
        if self.dim != dim {
            return Err(IndexError::InvalidArgument(format!(
                "codebook {:016x} is for dimension {}, the segment has dimension {dim}",
                self.info.id, self.dim
            )));
        }
        Ok(())
    }
}
