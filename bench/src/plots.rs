//! SVG plots (plotters, SVG backend only): bar charts of rates, log-log
//! fault-latency histograms, and a run's resident memory and faults over
//! time.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

const WIDTH: u32 = 960;

/// Distinct colours for series (colour-blind friendly order).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(240, 228, 66),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// plotters' errors borrow the backend's error type; make them plain.
fn plot_err<E: std::fmt::Debug>(path: &Path) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow!("cannot draw {}: {e:?}", path.display())
}

/// One horizontal bar.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Label on the left.
    pub label: String,
    /// Length.
    pub value: f64,
    /// Colour index (which legend entry it belongs to).
    pub series: usize,
}

/// Horizontal bars, one per label, the value printed at each bar's end.
/// `log` makes the value axis logarithmic (for rates that differ by more
/// than 10x, like 2 MiB against 4 KiB units). `legend` names the colour
/// indexes; empty for no legend.
pub fn hbars(
    path: &Path,
    title: &str,
    value_label: &str,
    bars: &[Bar],
    legend: &[&str],
    log: bool,
) -> Result<()> {
    let n = bars.len().max(1);
    let height = 120 + 34 * n as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    let err = plot_err(path);
    root.fill(&WHITE).map_err(&err)?;
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let min_pos = bars
        .iter()
        .map(|b| b.value)
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let label_of = |y: &f64| -> String {
        let i = y.round();
        if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < bars.len() {
            // The first bar is drawn at the top.
            bars[bars.len() - 1 - i as usize].label.clone()
        } else {
            String::new()
        }
    };
    let y_range = -0.5f64..(n as f64 - 0.5);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(250);
    let draw = |x0: f64, y: f64, x1: f64, i: usize| {
        Rectangle::new(
            [(x0, y - 0.36), (x1, y + 0.36)],
            color(bars[i].series).filled(),
        )
    };
    if log {
        let lo = (min_pos.min(max) / 2.0).max(1e-9);
        let mut chart = builder
            .build_cartesian_2d((lo..max * 3.0).log_scale(), y_range)
            .map_err(&err)?;
        chart
            .configure_mesh()
            .y_labels(n)
            .y_label_formatter(&label_of)
            .x_desc(format!("{value_label} (log scale)"))
            .disable_y_mesh()
            .draw()
            .map_err(&err)?;
        for (i, b) in bars.iter().enumerate() {
            let y = (bars.len() - 1 - i) as f64;
            chart
                .draw_series(std::iter::once(draw(lo, y, b.value.max(lo), i)))
                .map_err(&err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!(" {}", short(b.value)),
                    (b.value.max(lo), y + 0.15),
                    ("sans-serif", 14),
                )))
                .map_err(&err)?;
        }
        legend_boxes(&mut chart, legend).map_err(&err)?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(0.0..max * 1.25, y_range)
            .map_err(&err)?;
        chart
            .configure_mesh()
            .y_labels(n)
            .y_label_formatter(&label_of)
            .x_desc(value_label)
            .disable_y_mesh()
            .draw()
            .map_err(&err)?;
        for (i, b) in bars.iter().enumerate() {
            let y = (bars.len() - 1 - i) as f64;
            chart
                .draw_series(std::iter::once(draw(0.0, y, b.value, i)))
                .map_err(&err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!(" {}", short(b.value)),
                    (b.value, y + 0.15),
                    ("sans-serif", 14),
                )))
                .map_err(&err)?;
        }
        legend_boxes(&mut chart, legend).map_err(&err)?;
    }
    root.present().map_err(&err)?;
    Ok(())
}

/// Legend entries for bar colours, via plotters' series labels (an empty
/// series per entry carries the label).
fn legend_boxes<'a, X>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    legend: &[&str],
) -> Result<(), DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>>
where
    X: plotters::coord::ranged1d::Ranged,
{
    if legend.is_empty() {
        return Ok(());
    }
    for (i, name) in legend.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(std::iter::empty::<Rectangle<(X::ValueType, f64)>>())?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// One latency distribution: `(low_us, high_us, count)` buckets.
pub struct LatencySeries {
    /// Legend text.
    pub name: String,
    /// Buckets.
    pub buckets: Vec<(u64, u64, u64)>,
}

/// Log-log histogram: x = fault service time (µs), y = share of the
/// series' faults per bucket. Vertical lines mark the floors.
pub fn latency_histograms(
    path: &Path,
    title: &str,
    series: &[LatencySeries],
    floors: &[(String, f64)],
) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, 560)).into_drawing_area();
    let err = plot_err(path);
    root.fill(&WHITE).map_err(&err)?;
    let all = series.iter().flat_map(|s| s.buckets.iter());
    let x_lo = all.clone().map(|b| b.0.max(1)).min().unwrap_or(1) as f64;
    let x_hi = all.clone().map(|b| b.1).max().unwrap_or(10) as f64;
    let x_lo = floors.iter().map(|f| f.1).fold(x_lo, f64::min).max(1.0) / 1.5;
    let x_hi = floors.iter().map(|f| f.1).fold(x_hi, f64::max) * 1.5;
    let mut y_lo = 1.0f64;
    for s in series {
        let total: u64 = s.buckets.iter().map(|b| b.2).sum();
        for b in &s.buckets {
            y_lo = y_lo.min(b.2 as f64 / total.max(1) as f64);
        }
    }
    let y_lo = (y_lo / 2.0).max(1e-7);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..1.5f64).log_scale())
        .map_err(&err)?;
    chart
        .configure_mesh()
        .x_desc("fault service time, µs (log scale)")
        .y_desc("share of faults per bucket (log)")
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()
        .map_err(&err)?;
    for (i, s) in series.iter().enumerate() {
        let total: u64 = s.buckets.iter().map(|b| b.2).sum();
        if total == 0 {
            continue;
        }
        let c = color(i);
        // A step outline: each bucket spans [low, high) at its share; where
        // empty buckets lie between two, the line drops to the bottom of
        // the plot instead of bridging the gap.
        let mut pts = Vec::with_capacity(s.buckets.len() * 4);
        let mut prev_hi: Option<u64> = None;
        for &(lo, hi, n) in &s.buckets {
            let share = n as f64 / total as f64;
            if let Some(p) = prev_hi.filter(|p| *p != lo) {
                pts.push((p.max(2) as f64, y_lo));
                pts.push((lo.max(1) as f64, y_lo));
            }
            pts.push((lo.max(1) as f64, share));
            pts.push((hi.max(2) as f64, share));
            prev_hi = Some(hi);
        }
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(&err)?
            .label(format!("{} (n={total})", s.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    for (j, (name, us)) in floors.iter().enumerate() {
        let c = color(series.len() + j);
        chart
            .draw_series(LineSeries::new(
                vec![(*us, y_lo), (*us, 1.5)],
                c.stroke_width(1),
            ))
            .map_err(&err)?
            .label(format!("{name}: {}", fmt_us(*us)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)?;
    Ok(())
}

fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// One timeline sample.
pub struct TimePoint {
    /// Seconds since the vCPUs started.
    pub t_s: f64,
    /// Guest memory held by the engine, MiB.
    pub resident_mib: f64,
    /// Fault messages served so far.
    pub faults: f64,
    /// Restores from the store so far.
    pub store_faults: f64,
    /// Store MiB read + written so far.
    pub io_mib: f64,
}

/// Two panels over time: resident memory (with the limit), and cumulative
/// faults with store restores.
pub fn timeline(
    path: &Path,
    title: &str,
    points: &[TimePoint],
    limit_mib: Option<f64>,
) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, 640)).into_drawing_area();
    let err = plot_err(path);
    root.fill(&WHITE).map_err(&err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(&err)?;
    let (top, bottom) = root.split_vertically(300);
    let t_max = points.last().map_or(1.0, |p| p.t_s).max(1e-3);
    let mem_max = points
        .iter()
        .map(|p| p.resident_mib)
        .fold(limit_mib.unwrap_or(1.0), f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..mem_max)
        .map_err(&err)?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc("resident MiB")
        .draw()
        .map_err(&err)?;
    let c0 = color(0);
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.t_s, p.resident_mib)),
            c0.stroke_width(2),
        ))
        .map_err(&err)?
        .label("guest memory held (resident + staged)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c0.stroke_width(2)));
    if let Some(limit) = limit_mib {
        let c = color(6);
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, limit), (t_max, limit)],
                c.stroke_width(1),
            ))
            .map_err(&err)?
            .label(format!("--mem-limit {limit:.0} MiB"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(&err)?;

    let f_max = points
        .iter()
        .map(|p| p.faults.max(p.store_faults))
        .fold(1.0, f64::max)
        * 1.1;
    let io_max = points.iter().map(|p| p.io_mib).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..f_max)
        .map_err(&err)?
        .set_secondary_coord(0.0..t_max, 0.0..io_max);
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc("faults (cumulative)")
        .draw()
        .map_err(&err)?;
    chart
        .configure_secondary_axes()
        .y_desc("store I/O MiB (cumulative)")
        .draw()
        .map_err(&err)?;
    let (c1, c2, c3) = (color(1), color(2), color(3));
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.t_s, p.faults)),
            c1.stroke_width(2),
        ))
        .map_err(&err)?
        .label("fault messages served")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c1.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.t_s, p.store_faults)),
            c2.stroke_width(2),
        ))
        .map_err(&err)?
        .label("restores from the store")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c2.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(
            points.iter().map(|p| (p.t_s, p.io_mib)),
            c3.stroke_width(1),
        ))
        .map_err(&err)?
        .label("store I/O MiB (right axis)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c3.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)?;
    Ok(())
}

/// One named line of a plot: (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Two panels over time for memory that sizes itself: limits (and what
/// is resident) in MiB above, each one's stall as a percentage of vCPU
/// time below, with the stall target as a line. `marks` are times drawn
/// as thin vertical lines in both panels (phase changes).
pub fn limits_and_stall(
    path: &Path,
    title: &str,
    memory: &[Series],
    stall: &[Series],
    target_pct: f64,
    marks: &[f64],
) -> Result<()> {
    let root = SVGBackend::new(path, (WIDTH, 640)).into_drawing_area();
    let err = plot_err(path);
    root.fill(&WHITE).map_err(&err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(&err)?;
    let (top, bottom) = root.split_vertically(330);
    let all = || memory.iter().chain(stall).flat_map(|(_, p)| p.iter());
    let t_max = all().map(|p| p.0).fold(1e-3, f64::max);
    let panels: [(&_, &[Series], &str, f64); 2] = [
        (&top, memory, "MiB", 0.0),
        (&bottom, stall, "stall, % of vCPU time", target_pct),
    ];
    for (area, lines, y_desc, target) in panels {
        let y_max = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(target.max(1.0), f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, 0.0..y_max)
            .map_err(&err)?;
        chart
            .configure_mesh()
            .x_desc("s")
            .y_desc(y_desc)
            .draw()
            .map_err(&err)?;
        for &t in marks {
            chart
                .draw_series(LineSeries::new(
                    vec![(t, 0.0), (t, y_max)],
                    BLACK.mix(0.25).stroke_width(1),
                ))
                .map_err(&err)?;
        }
        for (i, (name, points)) in lines.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
                .map_err(&err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        if target > 0.0 {
            let c = color(6);
            chart
                .draw_series(LineSeries::new(
                    vec![(0.0, target), (t_max, target)],
                    c.stroke_width(1),
                ))
                .map_err(&err)?
                .label(format!("stall target {target} %"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(&err)?;
    }
    root.present().map_err(&err)?;
    Ok(())
}
