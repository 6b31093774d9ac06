//! Child processes of a test: loopback ports for them, signals, SIGTERM with a
//! deadline, and exit checks that leave the child to be reaped.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;
pub use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Returns a free loopback address for a child process to listen on.
///
/// Ports come from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port picked there and released could be
/// taken by any outgoing connection (a Raft RPC, an S3 request) before the
/// child binds it, and the child then fails with "address already in use".
/// Below that range only listeners take ports, so checking that the port binds
/// now is enough. An address is never handed out twice in one test process;
/// the walk starts at a random port, so concurrent test processes rarely meet.
pub fn free_address() -> String {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = listener_port_range();
    let span = u32::from(high - low);
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let start = rand::random::<u32>() % span;
    for step in 0..span {
        let port = low + u16::try_from((start + step) % span).expect("below span");
        if handed_out.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return format!("127.0.0.1:{port}");
        }
    }
    panic!("no free loopback port between {low} and {high}");
}

/// The ports below the ephemeral range: `[10000, ephemeral low)`, or
/// `[10000, 32768)` when the range cannot be read or leaves too little room.
fn listener_port_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    const DEFAULT_HIGH: u16 = 32_768;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral_low {
        Some(high) if high >= LOW + 2_000 => (LOW, high),
        _ => (LOW, DEFAULT_HIGH),
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("process ids fit an i32"))
}

/// Sends `signal` to `child` (SIGSTOP pauses it, SIGCONT resumes it); a child
/// that has ended already is not an error.
pub fn send_signal(child: &Child, signal: Signal) -> anyhow::Result<()> {
    match nix::sys::signal::kill(pid_of(child), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(error) => Err(error).with_context(|| format!("sending {signal} to {}", child.id())),
    }
}

/// Sends SIGTERM to `child` and waits up to `timeout` for it to exit; returns
/// its exit status. A child still running then is killed (SIGKILL) and reaped,
/// and that is an error.
pub fn terminate(child: &mut Child, timeout: Duration) -> anyhow::Result<ExitStatus> {
    send_signal(child, Signal::SIGTERM)?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "process {} did not exit within {timeout:?} of SIGTERM",
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tells whether `child` has ended (exited or killed), without reaping it: a
/// later `try_wait`/`wait` still gets its status.
pub fn has_ended(child: &Child) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match nix::sys::wait::waitid(Id::Pid(pid_of(child)), flags) {
        Ok(WaitStatus::StillAlive) => false,
        // Exited, signalled, or already reaped (ECHILD).
        Ok(_) | Err(_) => true,
    }
}

/// Makes `command`'s process start with no core files (crash-point aborts in
/// tests must not leave them behind).
pub fn without_core_dumps(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs between fork and exec; it only calls setrlimit,
    // which is async-signal-safe, and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
                .map_err(std::io::Error::from)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminated_child_ends_and_is_reaped() {
        let mut child = without_core_dumps(Command::new("sleep").arg("30"))
            .spawn()
            .expect("sleep runs");
        assert!(!has_ended(&child));
        send_signal(&child, Signal::SIGSTOP).unwrap();
        send_signal(&child, Signal::SIGCONT).unwrap();
        let status = terminate(&mut child, Duration::from_secs(10)).unwrap();
        assert!(!status.success(), "killed by SIGTERM: {status:?}");
    }

    #[test]
    fn an_ended_child_is_seen_before_it_is_reaped() {
        let mut child = Command::new("true").spawn().expect("true runs");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !has_ended(&child) {
            assert!(Instant::now() < deadline, "true did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(child.wait().unwrap().success(), "still reapable");
    }
}
