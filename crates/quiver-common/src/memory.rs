//! The memory this process can count on, for deciding what to hold resident
//! (the searcher's rows of mapped segment files).

use std::path::Path;

/// A cgroup v1 limit at or above this means "no limit" (the kernel reports
/// `PAGE_COUNTER_MAX` rounded to pages).
const CGROUP_V1_UNLIMITED: u64 = 1 << 60;

/// The memory this process can count on: the tightest limit of its memory
/// cgroup and the cgroups above it (v2 `memory.max`, v1
/// `memory.limit_in_bytes`: a Kubernetes pod's limit) and the machine's memory
/// (`MemTotal`). `None` when none can be read (not Linux).
pub fn memory_limit() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
    match (machine, cgroup) {
        (Some(machine), Some(cgroup)) => Some(machine.min(cgroup)),
        (machine, cgroup) => machine.or(cgroup),
    }
}

/// Share of [`memory_limit`] that rows (raw vectors, payloads) may keep resident
/// as huge pages: the rest is for the codes every query scans, the heap and, in
/// a standalone, the indexer's unflushed rows (up to 256 MiB by default).
const ROWS_MEMORY_SHARE: u64 = 4;

/// The bytes of rows a process may keep resident as huge pages — a searcher's
/// rows of mapped segment files, all segments together: a quarter of
/// [`memory_limit`] (0 when it is unknown).
pub fn rows_memory_budget() -> u64 {
    memory_limit().map_or(0, |limit| limit / ROWS_MEMORY_SHARE)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// The tightest memory limit of the cgroup `/proc/self/cgroup` names and its
/// ancestors, under the cgroup file system mounted at `root`.
fn cgroup_limit(self_cgroup: &str, root: &Path) -> Option<u64> {
    let read = |path: &Path| -> Option<u64> {
        let text = std::fs::read_to_string(path).ok()?;
        let value: u64 = text.trim().parse().ok()?; // "max" is no limit
        (value < CGROUP_V1_UNLIMITED).then_some(value)
    };
    let mut tightest: Option<u64> = None;
    for line in self_cgroup.lines() {
        // v2: "0::/path"; v1: "N:controllers:/path", the memory one.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|name| name == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut directory = base.join(path.trim_start_matches('/'));
        loop {
            if let Some(limit) = read(&directory.join(file)) {
                tightest = Some(tightest.map_or(limit, |known| known.min(limit)));
            }
            if directory == base || !directory.pop() {
                break;
            }
        }
    }
    tightest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24683824 kB\nMemFree:        19104512 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_683_824 << 10));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn the_tightest_cgroup_limit_on_the_way_up_counts() {
        let root = tempfile::tempdir().unwrap();
        let pod = root.path().join("kubepods/pod1");
        let container = pod.join("ctr");
        std::fs::create_dir_all(&container).unwrap();
        std::fs::write(root.path().join("kubepods/memory.max"), "8589934592\n").unwrap();
        std::fs::write(pod.join("memory.max"), "2147483648\n").unwrap();
        std::fs::write(container.join("memory.max"), "max\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/kubepods/pod1/ctr\n", root.path()),
            Some(2 << 30)
        );
        // No limit anywhere.
        std::fs::write(pod.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.path().join("kubepods/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit("0::/kubepods/pod1/ctr\n", root.path()), None);
        // cgroup v1: the memory controller's hierarchy; "unlimited" is huge.
        let v1 = root.path().join("memory/docker/abc");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "1073741824\n").unwrap();
        std::fs::write(
            root.path().join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(
            cgroup_limit(
                "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
                root.path()
            ),
            Some(1 << 30)
        );
    }
}
