//! Child processes of a test: loopback ports for them, signals, SIGTERM with a
//! deadline, and exit checks that leave the child to be reaped.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;
pub use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Returns a free loopback address (bound, then released: a small race with
/// other processes is accepted). An address is never handed out twice in one
/// test process: the kernel may offer a just-released port again, and two roles
/// of one test cluster told to listen on the same port fail to start.
pub fn free_address() -> String {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let address = listener.local_addr().expect("a bound listener's address");
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !handed_out.contains(&address.port()) {
            handed_out.push(address.port());
            return address.to_string();
        }
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
