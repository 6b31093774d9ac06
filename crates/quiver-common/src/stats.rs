//! Percentiles over sorted samples, for benchmarks and measurement reports.

/// Returns the `fraction` percentile (0.0 ..= 1.0) of ascending `sorted` samples by
/// the nearest rank (`round((len - 1) · fraction)`), or `None` when there are none.
pub fn percentile<T: Copy>(sorted: &[T], fraction: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let last = sorted.len() - 1;
    let index = ((last as f64) * fraction.clamp(0.0, 1.0)).round() as usize;
    Some(sorted[index.min(last)])
}

/// Returns the `fraction` percentile of ascending `sorted` samples, 0.0 when there
/// are none (what a report prints for an empty series).
pub fn percentile_or_zero(sorted: &[f64], fraction: f64) -> f64 {
    percentile(sorted, fraction).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.0), Some(1.0));
        assert_eq!(percentile(&samples, 0.5), Some(51.0));
        assert_eq!(percentile(&samples, 0.99), Some(99.0));
        assert_eq!(percentile(&samples, 1.0), Some(100.0));
        assert_eq!(percentile(&samples, 7.0), Some(100.0), "clamped");
        assert_eq!(percentile::<f64>(&[], 0.5), None);
        assert_eq!(percentile_or_zero(&[], 0.5), 0.0);
        let durations = [std::time::Duration::from_millis(3)];
        assert_eq!(
            percentile(&durations, 0.99),
            Some(std::time::Duration::from_millis(3))
        );
    }
}
