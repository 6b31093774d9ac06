//! PNG plots of benchmark results.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::engine::Point;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // The font is embedded, so plots render the same on every machine.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Draws recall (x) against queries per second (y, log scale), one line per rescore.
pub fn recall_vs_qps(path: &Path, title: &str, points: &[Point]) -> Result<()> {
    register_font();
    let root = BitMapBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let min_recall = points.iter().map(|p| p.recall).fold(1.0, f64::min).min(0.9);
    let max_qps = points.iter().map(|p| p.qps).fold(1.0, f64::max) * 1.5;
    let min_qps = points
        .iter()
        .map(|p| p.qps)
        .fold(f64::INFINITY, f64::min)
        .min(max_qps / 10.0)
        / 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (min_recall - 0.01)..1.0,
            (min_qps.max(1.0)..max_qps).log_scale(),
        )
        .map_err(|e| anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("recall@k")
        .y_desc("queries per second")
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    let mut rescores: Vec<usize> = points.iter().map(|p| p.rescore).collect();
    rescores.sort_unstable();
    rescores.dedup();
    for (index, rescore) in rescores.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let mut series: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.rescore == *rescore)
            .map(|p| (p.recall, p.qps))
            .collect();
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow!("plot: {e}"))?
            .label(format!("rescore {rescore}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|(x, y)| Circle::new((x, y), 4, color.filled())),
            )
            .map_err(|e| anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}
