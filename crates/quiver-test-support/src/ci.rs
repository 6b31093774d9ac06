//! Skipping a test visibly, or failing it under CI.

use std::io::Write;

/// Tells whether the tests run under CI: `CI` is set to anything but empty,
/// `0` or `false` (CI services set `CI=true`).
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| {
        let value = value.trim();
        !value.is_empty() && value != "0" && !value.eq_ignore_ascii_case("false")
    })
}

/// Returns the running test's name, as the test harness names its thread.
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("this test")
        .to_string()
}

/// Skips `what` (e.g. "the S3 part of this test") of the running test because of
/// `reason`: prints one line saying so straight to stderr (the harness does not
/// capture it, so the skip shows in every run). Under CI ([`under_ci`]) it panics
/// instead with `reason`: what CI lacks is a failure, not a skip.
#[track_caller]
pub fn skip_or_fail(what: &str, reason: &str) {
    let test = current_test();
    if under_ci() {
        panic!("{test}: {reason}; under CI this is a failure, not a skip ({what} must run)");
    }
    // Written to the stream itself, not through `eprintln!`, which the test
    // harness captures and shows only for failing tests.
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED {what} ({test}): {reason}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_test_is_named_after_its_thread() {
        assert!(current_test().contains("the_current_test_is_named_after_its_thread"));
    }
}
