//! A small tmpfs mounted for a test: a disk that really fills up.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::mount::{MntFlags, MsFlags};

use crate::ci::skip_or_fail;

/// A tmpfs mounted on a directory until dropped (then lazily detached, and the
/// mount point removed). Mounting needs root or CAP_SYS_ADMIN.
pub struct Tmpfs {
    path: PathBuf,
    /// The temporary directory the tmpfs is mounted on, when the test asked for one.
    _directory: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_bytes` on `path` (created if needed), mode 0755.
    pub fn mount(path: &Path, size_bytes: u64) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(path)
            .with_context(|| format!("creating mount point {}", path.display()))?;
        mount_tmpfs(path, size_bytes, 0o755)?;
        Ok(Tmpfs {
            path: path.to_path_buf(),
            _directory: None,
        })
    }

    /// Mounts a tmpfs of `size_bytes` (mode 0700) on a fresh temporary directory.
    /// Where mounting is not permitted, skips the test visibly and returns `None`;
    /// under CI (which runs as root) that panics instead.
    #[track_caller]
    pub fn mount_temporary(size_bytes: u64) -> Option<Tmpfs> {
        let directory = tempfile::tempdir().expect("a temporary directory");
        match mount_tmpfs(directory.path(), size_bytes, 0o700) {
            Ok(()) => Some(Tmpfs {
                path: directory.path().to_path_buf(),
                _directory: Some(directory),
            }),
            Err(error) => {
                skip_or_fail("this disk-full test", &format!("{error:#}"));
                None
            }
        }
    }

    /// Returns the mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Returns the path of the file [`Tmpfs::fill`] writes.
    pub fn filler(&self) -> PathBuf {
        self.path.join("filler.bin")
    }

    /// Fills the filesystem to its last block; returns the bytes written.
    pub fn fill(&self) -> anyhow::Result<u64> {
        self.fill_leaving(0)
    }

    /// Fills the filesystem (with a filler file) until at most `leave` bytes are
    /// free; returns the bytes written.
    pub fn fill_leaving(&self, leave: u64) -> anyhow::Result<u64> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())?;
        let mut written = 0u64;
        for chunk in [1 << 20, 64 << 10, 4 << 10, 512] {
            let bytes = vec![0x5a_u8; chunk];
            loop {
                if self.free_bytes()? <= leave {
                    break;
                }
                match file.write(&bytes) {
                    Ok(0) => break,
                    Ok(length) => written += length as u64,
                    Err(error)
                        if error.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) =>
                    {
                        break;
                    }
                    Err(error) => return Err(error).context("filling the tmpfs"),
                }
            }
        }
        let _ = file.sync_all();
        Ok(written)
    }

    /// Removes the filler.
    pub fn free(&self) -> anyhow::Result<()> {
        std::fs::remove_file(self.filler()).context("removing the filler")
    }

    /// Returns the bytes free on the filesystem.
    pub fn free_bytes(&self) -> anyhow::Result<u64> {
        let stats = nix::sys::statvfs::statvfs(&self.path)
            .with_context(|| format!("statvfs {}", self.path.display()))?;
        // Both are u64 on 64-bit Linux, narrower on other targets.
        #[allow(clippy::useless_conversion)]
        let free = u64::from(stats.blocks_available()) * u64::from(stats.fragment_size());
        Ok(free)
    }
}

fn mount_tmpfs(path: &Path, size_bytes: u64, mode: u32) -> anyhow::Result<()> {
    let options = format!("size={size_bytes},mode={mode:o}");
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .with_context(|| {
        format!(
            "mounting a {size_bytes}-byte tmpfs on {} failed (mounting needs root, or \
             CAP_SYS_ADMIN in a container; CI runs as root)",
            path.display()
        )
    })
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // A lazy detach never blocks, even while a process still has files open.
        let _ = nix::mount::umount2(&self.path, MntFlags::MNT_DETACH);
        if self._directory.is_some() {
            return;
        }
        // The directory the mount point was made in may already be gone except
        // for the mount point (removal stops at a mounted filesystem): remove it
        // and whichever parents it leaves empty.
        let _ = std::fs::remove_dir(&self.path);
        let mut parent = self.path.parent();
        for _ in 0..2 {
            let Some(directory) = parent else { break };
            if std::fs::remove_dir(directory).is_err() {
                break;
            }
            parent = directory.parent();
        }
    }
}
