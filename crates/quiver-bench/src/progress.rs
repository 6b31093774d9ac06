//! Progress bars for long steps.

use indicatif::{ProgressBar, ProgressStyle};

/// Returns a progress bar of `total` steps labelled `label`.
pub fn bar(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:40}] {pos}/{len} {elapsed_precise} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}
