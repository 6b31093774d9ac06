//! Room left on the disk of the data directory.
//!
//! openraft 0.9 stops a node for good on a failed log write (its storage errors
//! are fatal), so a metadata node must never let its log meet a full disk: writes
//! are refused while less than `min_free_disk_bytes` is left, and everything
//! that does not write (reads, read-index rounds, heartbeats of the Raft
//! leader) goes on.

use std::path::Path;

/// Returns the bytes an unprivileged writer may still use on the filesystem of
/// `path`, or `None` if the filesystem cannot be asked.
pub(crate) fn free_disk_bytes(path: &Path) -> Option<u64> {
    let stats = rustix::fs::statvfs(path).ok()?;
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_of_a_real_directory_and_none_for_a_missing_one() {
        let directory = tempfile::tempdir().expect("temp dir");
        assert!(free_disk_bytes(directory.path()).is_some_and(|free| free > 0));
        assert_eq!(free_disk_bytes(&directory.path().join("missing")), None);
    }
}
