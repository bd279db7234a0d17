//! The SVG plots of `loopback`: latency by percentile, and throughput per format and transport;
//! and of `scale`: memory and throughput over the run's time.
//!
//! Latency uses HdrHistogram's percentile axis: x = 1 / (1 − p) on a log scale, so 50 %, 90 %,
//! 99 %, 99.9 % and 99.99 % are evenly spaced and the tail gets as much room as the median.

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One line of a latency plot: a name and (percentile in %, µs) points.
pub struct Curve {
    /// The legend's text.
    pub name: String,
    /// Points in increasing percentile.
    pub points: Vec<(f64, f64)>,
}

/// One bar of a throughput plot.
pub struct Bar {
    /// The x axis label.
    pub label: String,
    /// Millions of messages per second.
    pub mmsgs: f64,
}

/// The x of percentile `p` (in %) on the percentile axis.
pub fn percentile_x(p: f64) -> f64 {
    1.0 / (1.0 - (p / 100.0).min(0.999_999))
}

/// The percentile (in %) shown at `x`, trimmed: 50, 90, 99, 99.9, ...
fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x);
    format!("{}%", (p * 1000.0).round() / 1000.0)
}

/// Writes `curves` to `path`: one line per curve, x on the percentile axis up to 99.999 %.
pub fn latency(path: &Path, title: &str, curves: &[Curve]) -> Result<()> {
    let values = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1)).filter(|v| *v > 0.0);
    let (low, high) = values.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (low, high) = if high > 0.0 { (low / 1.5, high * 1.5) } else { (1.0, 10.0) };
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let x = (1f64..1e5).log_scale().with_key_points(vec![1.0, 2.0, 10.0, 100.0, 1e3, 1e4, 1e5]);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x, (low..high).log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("one-way latency, µs")
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let lines = curves.iter().enumerate().map(|(i, curve)| {
        // The floor in black, the formats in the palette's colours.
        let color = if i == 0 { BLACK.to_rgba() } else { Palette99::pick(i - 1).to_rgba() };
        let points = curve.points.iter().filter(|p| p.1 > 0.0).map(|&(p, us)| (percentile_x(p), us)).collect();
        (points, curve.name.clone(), color)
    });
    draw_lines(&mut chart, lines, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Writes `bars` to `path` as a bar chart of millions of messages per second.
pub fn throughput(path: &Path, title: &str, bars: &[Bar]) -> Result<()> {
    let top = bars.iter().map(|b| b.mmsgs).fold(0.0f64, f64::max).max(0.1) * 1.15;
    let width = (160 + 70 * bars.len() as u32).max(640);
    let root = SVGBackend::new(path, (width, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let n = bars.len() as u32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(150)
        .y_label_area_size(60)
        .build_cartesian_2d((0u32..n).into_segmented(), 0f64..top)
        .map_err(|e| anyhow!("{e}"))?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("million messages per second")
        .x_labels(bars.len().max(1))
        .x_label_style(("sans-serif", 13).into_font().transform(FontTransform::Rotate90))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(BLUE.mix(0.6).filled())
                .margin(8)
                .data(bars.iter().enumerate().map(|(i, b)| (i as u32, b.mmsgs))),
        )
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Text::new(format!("{:.2}", b.mmsgs), (SegmentValue::CenterOf(i as u32), b.mmsgs), ("sans-serif", 12))
        }))
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Writes the `scale` plot to `path`: each process's resident memory (MiB, top) and each
/// subscriber's throughput (million messages per second, bottom) against seconds since the
/// publisher started. One time axis for both, so growth and slow-downs line up; both y axes
/// start at zero, so flat looks flat and a small drift is not magnified.
pub fn over_time(path: &Path, title: &str, memory: &[Curve], throughput: &[Curve]) -> Result<()> {
    let end = memory.iter().chain(throughput).flat_map(|c| c.points.iter().map(|p| p.0)).fold(1.0f64, f64::max);
    let root = SVGBackend::new(path, (960, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|e| anyhow!("{e}"))?;
    let (upper, lower) = root.split_vertically(360);
    over_time_panel(&upper, "resident memory, MiB", end, memory, 0)?;
    // The subscribers come after the publisher among the memory curves: the same colours here.
    let first_colour = memory.len().saturating_sub(throughput.len());
    over_time_panel(&lower, "million messages per second", end, throughput, first_colour)?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// One panel of [`over_time`]: a line per curve, x from 0 to `end` seconds, coloured from the
/// palette's `first_colour` on.
fn over_time_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    y_desc: &str,
    end: f64,
    curves: &[Curve],
    first_colour: usize,
) -> Result<()> {
    let top = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..end, 0f64..top)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the publisher started")
        .y_desc(y_desc)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let lines = curves
        .iter()
        .enumerate()
        .map(|(i, curve)| (curve.points.clone(), curve.name.clone(), Palette99::pick(first_colour + i).to_rgba()));
    draw_lines(&mut chart, lines, SeriesLabelPosition::LowerRight)
}

/// Draws each `(points, name, colour)` of `lines` as a line on `chart`, with a legend of their
/// names at `position`.
fn draw_lines<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    lines: impl Iterator<Item = (Vec<(f64, f64)>, String, RGBAColor)>,
    position: SeriesLabelPosition,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (points, name, color) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
