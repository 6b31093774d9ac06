//! PNG plots of benchmark results.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

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

/// Registers the embedded font (once) before any plot is drawn.
pub fn ensure_font() {
    register_font();
}

/// One line of a recall/QPS plot.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws recall (x) against queries per second (y, log scale), one line per series.
pub fn recall_vs_qps(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    register_font();
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    let root = BitMapBackend::new(path, (1024, 680)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let min_recall = all.iter().map(|p| p.0).fold(1.0, f64::min).clamp(0.8, 0.9);
    let max_qps = all.iter().map(|p| p.1).fold(1.0, f64::max) * 1.5;
    let min_qps = all
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .min(max_qps / 10.0)
        / 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (min_recall - 0.01)..1.0,
            (min_qps.max(1.0)..max_qps).log_scale(),
        )
        .map_err(|e| anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("recall@k")
        .y_desc("queries per second (1 thread)")
        .y_label_formatter(&|qps| format!("{qps:.0}"))
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    for (index, line) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let mut points: Vec<(f64, f64)> = line
            .points
            .iter()
            .copied()
            .filter(|(recall, _)| *recall >= min_recall - 0.01)
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow!("plot: {e}"))?
            .label(line.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(|e| anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}
