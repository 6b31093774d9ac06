//! Room left on the disk of the data directory.
//!
//! openraft 0.9 stops a node for good on a failed log write (its storage errors
//! are fatal), so a metadata node must never let its log meet a full disk: writes
//! are refused while less than `min_free_disk_bytes` is left, and everything
//! that does not write (reads, read-index rounds, heartbeats of the Raft
//! leader) goes on.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Returns the bytes an unprivileged writer may still use on the filesystem of
/// `path`, or `None` if the filesystem cannot be asked.
pub(crate) fn free_disk_bytes(path: &Path) -> Option<u64> {
    let path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter and the path is a valid
    // NUL-terminated string for the duration of the call.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    let status = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    (status == 0).then(|| (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
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
