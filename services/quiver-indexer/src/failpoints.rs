//! Crash points of the write path for fault-injection tests (`tests/reliability`),
//! built on TiKV's `fail` crate and compiled out unless the crate feature
//! `failpoints` is on (the `quiver` binary forwards it; its tests turn it on, a
//! release build does not have it).
//!
//! The points ([`CRASH_POINTS`]): `wal-put` (while a WAL object's PUT is in
//! flight, or the instant it completes), `wal-commit` (after the WAL PUT, before
//! the commit to meta), `wal-ack` (after the commit to meta, before the writers
//! are answered), `flush-upload` (while a flush's segment PUT is in flight),
//! `flush-commit` (after a flush's uploads, before its manifest change),
//! `merge-upload` (while a merge's segment PUT is in flight) and `merge-commit`
//! (after a merge's uploads, before its manifest change).
//!
//! They are armed through fail's `FAILPOINTS` variable, read once when the
//! indexer node starts: `FAILPOINTS='flush-commit=2*off->return'` lets two
//! arrivals pass and aborts the process at the third — no unwinding, no
//! cleanup, like `kill -9`. The `return` action is the crash; fail's other
//! actions (`sleep(ms)`, `pause`, `panic`, …) work as fail documents them.

/// The environment variable (fail's own) that arms crash points.
pub const FAILPOINTS_VARIABLE: &str = "FAILPOINTS";

/// The names of the crash points, in write-path order.
pub const CRASH_POINTS: [&str; 7] = [
    "wal-put",
    "wal-commit",
    "wal-ack",
    "flush-upload",
    "flush-commit",
    "merge-upload",
    "merge-commit",
];

#[cfg(feature = "failpoints")]
mod armed {
    use std::future::Future;
    use std::time::Duration;

    use super::{CRASH_POINTS, FAILPOINTS_VARIABLE};

    /// Configures every `<point>=<actions>` of `FAILPOINTS` (`;`-separated);
    /// the error names the variable, the point and what is wrong.
    pub(crate) fn arm_from_env() -> Result<(), String> {
        let Ok(text) = std::env::var(FAILPOINTS_VARIABLE) else {
            return Ok(());
        };
        for entry in text
            .split(';')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            let (point, actions) = parse_entry(entry)?;
            fail::cfg(point, actions)
                .map_err(|error| format!("{FAILPOINTS_VARIABLE} `{entry}`: {error}"))?;
            tracing::warn!(
                point,
                actions,
                "failpoints armed: this process may abort at a crash point"
            );
        }
        Ok(())
    }

    /// Splits `<point>=<actions>`; the point must be one of [`CRASH_POINTS`],
    /// so a typo does not silently arm nothing.
    fn parse_entry(entry: &str) -> Result<(&str, &str), String> {
        let (point, actions) = entry
            .split_once('=')
            .map(|(point, actions)| (point.trim(), actions.trim()))
            .ok_or_else(|| {
                format!("{FAILPOINTS_VARIABLE} `{entry}`: expected `<point>=<actions>`")
            })?;
        if !CRASH_POINTS.contains(&point) {
            return Err(format!(
                "{FAILPOINTS_VARIABLE} `{entry}`: unknown crash point `{point}`; expected one of {}",
                CRASH_POINTS.join(", ")
            ));
        }
        Ok((point, actions))
    }

    /// Returns true when fail's `return` action fires for this arrival.
    fn fires(point: &'static str) -> bool {
        fail::fail_point!(point, |_| true);
        false
    }

    fn abort_at(point: &'static str) -> ! {
        // stderr is unbuffered: the line is in the log before the process is gone.
        eprintln!("{FAILPOINTS_VARIABLE}: aborting at crash point {point}");
        std::process::abort()
    }

    /// Aborts the process if `point` fires.
    pub(crate) fn reached(point: &'static str) {
        fail::fail_point!(point, |_| abort_at(point));
    }

    /// Runs `operation`; if `point` fires, aborts while it is in flight (after a
    /// random delay of up to 5 ms) or the instant it completes, whichever is first.
    pub(crate) async fn during<F: Future>(point: &'static str, operation: F) -> F::Output {
        if !fires(point) {
            return operation.await;
        }
        let delay = Duration::from_micros(rand::random_range(0..5_000));
        tokio::select! {
            _ = operation => {}
            _ = tokio::time::sleep(delay) => {}
        }
        abort_at(point)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn entries_parse_and_bad_values_are_named() {
            assert_eq!(
                parse_entry("flush-commit=2*off->return").expect("valid"),
                ("flush-commit", "2*off->return")
            );
            let error = parse_entry("wal-pot=return").expect_err("unknown point");
            assert!(
                error.contains("`wal-pot`") && error.contains("merge-commit"),
                "{error}"
            );
            let error = parse_entry("wal-put").expect_err("no actions");
            assert!(error.contains("<point>=<actions>"), "{error}");
            for point in CRASH_POINTS {
                assert_eq!(
                    parse_entry(&format!("{point}=return")).expect("own name").0,
                    point
                );
            }
        }

        #[test]
        fn a_crash_point_fires_at_the_nth_arrival() {
            // A point no other test arms: the registry is global to the process.
            let point = "merge-upload";
            fail::cfg(point, "2*off->return").expect("valid actions");
            assert!(!fires(point));
            assert!(!fires(point));
            assert!(fires(point));
            fail::remove(point);
            assert!(!fires(point));
        }
    }
}

#[cfg(feature = "failpoints")]
pub(crate) use armed::{arm_from_env, during, reached};

/// Without the `failpoints` feature nothing is armed: `FAILPOINTS` is only
/// reported, so a test run against a release binary says why nothing crashed.
#[cfg(not(feature = "failpoints"))]
pub(crate) fn arm_from_env() -> Result<(), String> {
    if std::env::var_os(FAILPOINTS_VARIABLE).is_some() {
        tracing::warn!(
            "{FAILPOINTS_VARIABLE} is set but this build has no failpoints (cargo feature `failpoints`)"
        );
    }
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn reached(_point: &'static str) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) async fn during<F: std::future::Future>(
    _point: &'static str,
    operation: F,
) -> F::Output {
    operation.await
}
