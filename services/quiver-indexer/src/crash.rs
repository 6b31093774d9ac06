//! Test-only crash points for fault-injection tests (`tests/reliability`).
//!
//! `QUIVER_TEST_CRASH_AT=<point>[:<nth>]` makes the indexer process abort — no
//! unwinding, no cleanup, like `kill -9` — the `nth` time (default: the first)
//! the write path reaches `<point>`. The variable is read once, when the
//! indexer node starts; when it is unset, every check is one load of a
//! once-initialised value. Never set it outside tests.
//!
//! Points (see [`CrashPoint::NAMES`]): `wal-put` (while a WAL object's PUT is in
//! flight, or the instant it completes), `wal-commit` (after the WAL PUT, before
//! the commit to meta), `wal-ack` (after the commit to meta, before the writers
//! are answered), `flush-upload` (while a flush's segment PUT is in flight),
//! `flush-commit` (after a flush's uploads, before its manifest change),
//! `merge-upload` (while a merge's segment PUT is in flight) and `merge-commit`
//! (after a merge's uploads, before its manifest change).

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The variable that arms a crash point.
pub const CRASH_VARIABLE: &str = "QUIVER_TEST_CRASH_AT";

/// A place in the write path where a test may crash the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CrashPoint {
    WalPut,
    WalCommit,
    WalAck,
    FlushUpload,
    FlushCommit,
    MergeUpload,
    MergeCommit,
}

impl CrashPoint {
    const ALL: [CrashPoint; 7] = [
        CrashPoint::WalPut,
        CrashPoint::WalCommit,
        CrashPoint::WalAck,
        CrashPoint::FlushUpload,
        CrashPoint::FlushCommit,
        CrashPoint::MergeUpload,
        CrashPoint::MergeCommit,
    ];

    /// The names `QUIVER_TEST_CRASH_AT` accepts, in [`CrashPoint::ALL`] order.
    const NAMES: [&'static str; 7] = [
        "wal-put",
        "wal-commit",
        "wal-ack",
        "flush-upload",
        "flush-commit",
        "merge-upload",
        "merge-commit",
    ];

    fn name(self) -> &'static str {
        let index = CrashPoint::ALL
            .iter()
            .position(|point| *point == self)
            .expect("every point is listed");
        CrashPoint::NAMES[index]
    }
}

struct Armed {
    point: CrashPoint,
    nth: u64,
    reached: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

/// Parses `<point>[:<nth>]`; the error names the variable and what is wrong.
fn parse(text: &str) -> Result<Armed, String> {
    let (name, nth) = match text.split_once(':') {
        Some((name, nth)) => {
            let nth: u64 = nth.trim().parse().map_err(|_| {
                format!("{CRASH_VARIABLE} `{text}`: `{nth}` is not a positive count")
            })?;
            if nth == 0 {
                return Err(format!(
                    "{CRASH_VARIABLE} `{text}`: the count must be at least 1"
                ));
            }
            (name.trim(), nth)
        }
        None => (text.trim(), 1),
    };
    let index = CrashPoint::NAMES
        .iter()
        .position(|known| *known == name)
        .ok_or_else(|| {
            format!(
                "{CRASH_VARIABLE} `{text}`: unknown crash point `{name}`; expected one of {}",
                CrashPoint::NAMES.join(", ")
            )
        })?;
    Ok(Armed {
        point: CrashPoint::ALL[index],
        nth,
        reached: AtomicU64::new(0),
    })
}

/// Reads `QUIVER_TEST_CRASH_AT` once (later calls keep the first reading).
pub(crate) fn arm_from_env() -> Result<(), String> {
    let armed = match std::env::var(CRASH_VARIABLE) {
        Ok(text) if !text.trim().is_empty() => Some(parse(&text)?),
        _ => None,
    };
    if let Some(armed) = &armed {
        tracing::warn!(
            point = armed.point.name(),
            nth = armed.nth,
            "test crash point armed: this process will abort"
        );
    }
    let _ = ARMED.set(armed);
    Ok(())
}

/// Returns true when this arrival at `point` is the one to crash at.
fn fires(point: CrashPoint) -> bool {
    let Some(Some(armed)) = ARMED.get() else {
        return false;
    };
    armed.point == point && armed.reached.fetch_add(1, Ordering::Relaxed) + 1 == armed.nth
}

fn abort(point: CrashPoint) -> ! {
    // stderr is unbuffered: the line is in the log before the process is gone.
    eprintln!("{CRASH_VARIABLE}: aborting at crash point {}", point.name());
    std::process::abort()
}

/// Aborts the process if `point` is armed and reached for the nth time.
pub(crate) fn reached(point: CrashPoint) {
    if fires(point) {
        abort(point);
    }
}

/// Runs `operation`; if `point` fires, aborts while it is in flight (after a
/// random delay of up to 5 ms) or the instant it completes, whichever is first.
pub(crate) async fn during<F: Future>(point: CrashPoint, operation: F) -> F::Output {
    if !fires(point) {
        return operation.await;
    }
    let delay = Duration::from_micros(rand::random_range(0..5_000));
    tokio::select! {
        _ = operation => {}
        _ = tokio::time::sleep(delay) => {}
    }
    abort(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_parse_and_bad_values_are_named() {
        let armed = parse("flush-commit:3").expect("valid");
        assert_eq!(armed.point, CrashPoint::FlushCommit);
        assert_eq!(armed.nth, 3);
        assert_eq!(parse("wal-put").expect("valid").nth, 1);
        let error = parse("wal-pot").err().expect("unknown point");
        assert!(
            error.contains("`wal-pot`") && error.contains("merge-commit"),
            "{error}"
        );
        let error = parse("wal-put:0").err().expect("zero count");
        assert!(error.contains("at least 1"), "{error}");
        let error = parse("wal-put:x").err().expect("bad count");
        assert!(error.contains("`x`"), "{error}");
        for point in CrashPoint::ALL {
            assert_eq!(parse(point.name()).expect("own name").point, point);
        }
    }
}
