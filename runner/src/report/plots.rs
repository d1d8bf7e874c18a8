//! The report's plots, drawn with plotters' SVG backend (text as SVG `<text>`, sans-serif, no font
//! files): speed against the swept value, prefill time against prompt length by point, MiB read
//! per token and RAM headroom (or peak RSS) against `cache_mb`; legends sit beside the plot, and
//! the `--best` point is ringed.
use std::collections::BTreeMap;

use plotters::prelude::*;
use serde::Serialize;

use super::best::Best;
use super::error::ReportError;
use super::group::Group;
use super::input::Data;

/// One rendered plot.
#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    /// Stable id (`speed`, `prefill`, `read`, `headroom` or `rss`).
    pub id: &'static str,
    /// Title.
    pub title: String,
    /// The SVG document (not serialized into the JSON report).
    #[serde(skip)]
    pub svg: String,
}

/// A named series of (x, y) points; `lo`/`hi` give an optional p10..p90 bar per point.
struct Series {
    name: String,
    pts: Vec<(f64, f64)>,
    bars: Vec<(f64, f64, f64)>,
    line: bool,
}

const COLORS: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn plot_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> ReportError {
    ReportError::Plot(e.to_string())
}

/// Pads a range so a single value still gets an axis.
fn range(vals: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero && lo > 0.0 {
        lo = 0.0;
    }
    let span = hi - lo;
    let pad = if span > 0.0 {
        span * 0.08
    } else {
        hi.abs().max(1.0) * 0.1
    };
    (
        lo - if from_zero && lo == 0.0 { 0.0 } else { pad },
        hi + pad,
    )
}

/// A tick label: integers without a fraction, others with as few digits as they need.
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 * v.abs().max(1.0) {
        format!("{:.0}", v.round())
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// The x ticks: the swept values themselves when they are a few integers, else plotters' own.
fn x_ticks(series: &[Series], x0: f64, x1: f64) -> Vec<f64> {
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.pts.iter().map(|p| p.0))
        .collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.dedup();
    if !xs.is_empty() && xs.len() <= 12 && xs.iter().all(|x| x.fract() == 0.0) {
        return xs;
    }
    let r: plotters::coord::types::RangedCoordf64 = (x0..x1).into();
    r.key_points(8)
}

/// An f64 axis whose ticks are given (the swept values), not chosen by plotters.
struct Ticked {
    inner: plotters::coord::types::RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;
    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }
    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.clone()
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// Legend rows shown beside a plot before the rest are summarised as `... N more`.
const LEGEND_ROWS: usize = 20;

/// Draws the legend in its own panel beside the plot, so it never covers data.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
    best: bool,
) -> Result<(), ReportError> {
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    let mut entries: Vec<(String, RGBColor, bool)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.clone(), COLORS[i % COLORS.len()], s.line))
        .collect();
    if entries.len() > LEGEND_ROWS {
        let more = entries.len() - (LEGEND_ROWS - 1);
        entries.truncate(LEGEND_ROWS - 1);
        entries.push((format!("... {more} more"), WHITE, false));
    }
    let mut y = 40;
    for (name, c, line) in entries {
        if line {
            area.draw(&PathElement::new(vec![(6, y), (24, y)], c.stroke_width(2)))
                .map_err(plot_err)?;
        }
        area.draw(&Circle::new((15, y), 4, c.filled()))
            .map_err(plot_err)?;
        area.draw(&Text::new(name, (30, y - 7), font.clone()))
            .map_err(plot_err)?;
        y += 19;
    }
    if best {
        area.draw(&Circle::new((15, y), 8, BLACK.stroke_width(2)))
            .map_err(plot_err)?;
        area.draw(&Text::new("best point (--best)", (30, y - 7), font))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Draws one chart, its legend beside it; `marks` are the `--best` points, ringed.
fn chart(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    marks: &[(f64, f64)],
) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (plot_area, legend_area) = root.split_horizontally(640);
        let xs = series.iter().flat_map(|s| s.pts.iter().map(|p| p.0));
        let (x0, x1) = range(xs, false);
        let ys = series.iter().flat_map(|s| {
            s.pts
                .iter()
                .map(|p| p.1)
                .chain(s.bars.iter().flat_map(|b| [b.1, b.2]))
        });
        let (y0, y1) = range(ys, true);
        let ticks = x_ticks(series, x0, x1);
        let mut ch = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                Ticked {
                    inner: (x0..x1).into(),
                    ticks,
                },
                y0..y1,
            )
            .map_err(plot_err)?;
        ch.configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(plot_err)?;
        for (i, s) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            if s.line && s.pts.len() > 1 {
                ch.draw_series(LineSeries::new(s.pts.iter().copied(), c.stroke_width(2)))
                    .map_err(plot_err)?;
            }
            ch.draw_series(
                s.bars
                    .iter()
                    .map(|&(x, lo, hi)| PathElement::new(vec![(x, lo), (x, hi)], c)),
            )
            .map_err(plot_err)?;
            ch.draw_series(PointSeries::of_element(
                s.pts.iter().copied(),
                3,
                c.filled(),
                &|p, size, style| EmptyElement::at(p) + Circle::new((0, 0), size, style),
            ))
            .map_err(plot_err)?;
        }
        ch.draw_series(marks.iter().map(|&p| {
            EmptyElement::at(p)
                + Circle::new((0, 0), 8, BLACK.stroke_width(2))
                + Text::new("best", (10, -16), ("sans-serif", 13))
        }))
        .map_err(plot_err)?;
        legend(&legend_area, series, !marks.is_empty())?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Series name for a group: the profile (prefixed with the job when several jobs are plotted),
/// with what sets a split group apart.
fn series_name(g: &Group, many_jobs: bool) -> String {
    let mut name = if many_jobs {
        format!("{} / {}", g.job, g.profile)
    } else {
        g.profile.clone()
    };
    if !g.differs.is_empty() {
        let what: Vec<String> = g.differs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        name.push_str(&format!(" [{}]", what.join(", ")));
    }
    name
}

/// The swept key to put on the speed plot's x axis: the first key whose values all parse as numbers.
fn swept_key(groups: &[Group]) -> Option<String> {
    let mut keys: Vec<&String> = Vec::new();
    for g in groups {
        for k in g.params.keys() {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys.into_iter()
        .find(|k| {
            groups
                .iter()
                .filter_map(|g| g.params.get(*k))
                .all(|v| v.parse::<f64>().is_ok())
        })
        .cloned()
}

/// Whether `g` won `--best` for its (job, profile).
fn won(best: &[Best], g: &Group) -> bool {
    best.iter()
        .any(|b| b.job == g.job && b.profile == g.profile && b.point == g.label)
}

/// All plots the data allows, plus a note for each one it does not.
pub fn plots(
    d: &Data,
    groups: &[Group],
    ram: &BTreeMap<String, f64>,
    best: &[Best],
) -> Result<(Vec<Plot>, Vec<String>), ReportError> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    if let Some(p) = speed_plot(groups, best, &mut notes)? {
        out.push(p);
    }
    if let Some(p) = prefill_plot(d, groups, &mut notes)? {
        out.push(p);
    }
    if !d.has("cache_mb") {
        notes.push("read and memory plots: no cache_mb column".into());
        return Ok((out, notes));
    }
    if let Some(p) = read_plot(groups, best, &mut notes)? {
        out.push(p);
    }
    if let Some(p) = memory_plot(d, groups, ram, best, &mut notes)? {
        out.push(p);
    }
    Ok((out, notes))
}

/// Plot 1: speed against the swept value (or the point's position when nothing numeric is swept).
fn speed_plot(
    groups: &[Group],
    best: &[Best],
    notes: &mut Vec<String>,
) -> Result<Option<Plot>, ReportError> {
    let many_jobs = groups.iter().any(|g| g.job != groups[0].job);
    let key = swept_key(groups);
    let x_of = |gi: usize, g: &Group| -> f64 {
        key.as_ref()
            .and_then(|k| g.params.get(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(gi as f64)
    };
    let mut speed: BTreeMap<String, Series> = BTreeMap::new();
    let mut marks = Vec::new();
    for (metric, label) in [("prefill_tps", "prefill"), ("decode_tps", "decode")] {
        for (gi, g) in groups.iter().enumerate() {
            let Some(s) = g.metrics.get(metric) else {
                continue;
            };
            let name = format!("{} {label}", series_name(g, many_jobs));
            let e = speed.entry(name.clone()).or_insert(Series {
                name,
                pts: Vec::new(),
                bars: Vec::new(),
                line: true,
            });
            let x = x_of(gi, g);
            e.pts.push((x, s.median));
            e.bars.push((x, s.p10, s.p90));
            if won(best, g) {
                marks.push((x, s.median));
            }
        }
    }
    if speed.is_empty() {
        notes.push("speed plot: no row measured prefill_tps or a decode rate".into());
        return Ok(None);
    }
    let mut series: Vec<Series> = speed.into_values().collect();
    for s in &mut series {
        s.pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let xd = key.unwrap_or_else(|| "point (order of appearance)".into());
    Ok(Some(Plot {
        id: "speed",
        title: format!("Speed against {xd} (median, p10..p90 bars)"),
        svg: chart(
            &format!("Speed against {xd}"),
            &xd,
            "tokens/s",
            &series,
            &marks,
        )?,
    }))
}

/// Plot 2: prefill time against prompt length, every row, coloured by its group (point, with the
/// profile when several are plotted), device and CPU rows apart.
fn prefill_plot(
    d: &Data,
    groups: &[Group],
    notes: &mut Vec<String>,
) -> Result<Option<Plot>, ReportError> {
    let many_jobs = groups.iter().any(|g| g.job != groups[0].job);
    let many_profiles = groups.iter().any(|g| g.profile != groups[0].profile);
    let mut series: Vec<Series> = Vec::new();
    for g in groups {
        let (mut dev, mut cpu) = (Vec::new(), Vec::new());
        for r in g.members.iter().map(|&i| &d.recs[i]).filter(|r| !r.failed) {
            // Prefilled tokens, not the whole prompt: a reused prefix costs no prefill time.
            let n = d.num(r, "n_prefilled").or_else(|| d.num(r, "n_prompt"));
            let (Some(n), Some(s)) = (n, d.num(r, "prefill_s")) else {
                continue;
            };
            if n <= 0.0 {
                continue;
            }
            if d.num(r, "prefill_dev_tokens").unwrap_or(0.0) > 0.0 {
                dev.push((n, s));
            } else {
                cpu.push((n, s));
            }
        }
        let mut prefix = String::new();
        if many_jobs {
            prefix.push_str(&format!("{} / ", g.job));
        }
        if many_profiles || many_jobs {
            prefix.push_str(&format!("{} ", g.profile));
        }
        for (on, pts) in [("CPU", cpu), ("device", dev)] {
            if !pts.is_empty() {
                series.push(Series {
                    name: format!("{prefix}{} {on} ({} rows)", g.label, pts.len()),
                    pts,
                    bars: Vec::new(),
                    line: false,
                });
            }
        }
    }
    if series.is_empty() {
        notes.push("prefill plot: no row has n_prompt and prefill_s".into());
        return Ok(None);
    }
    Ok(Some(Plot {
        id: "prefill",
        title: "Prefill time against prompt length, by point".into(),
        svg: chart(
            "Prefill time against prompt length",
            "prompt tokens",
            "prefill s",
            &series,
            &[],
        )?,
    }))
}

/// Per-group medians of `metric` against the resolved cache budget, one series per profile;
/// `value` maps a group's median, p10 and p90 to what is drawn (`None` leaves the group out),
/// `suffix` adds to the series name.
fn by_cache(
    groups: &[Group],
    metric: &str,
    best: &[Best],
    value: &dyn Fn(&Group, f64) -> Option<f64>,
    suffix: &dyn Fn(&Group) -> String,
) -> (Vec<Series>, Vec<(f64, f64)>) {
    let many_jobs = groups.iter().any(|g| g.job != groups[0].job);
    let mut by: BTreeMap<String, Series> = BTreeMap::new();
    let mut marks = Vec::new();
    for g in groups {
        let (Some(x), Some(s)) = (g.cache_mb, g.metrics.get(metric)) else {
            continue;
        };
        let (Some(m), Some(a), Some(b)) = (value(g, s.median), value(g, s.p10), value(g, s.p90))
        else {
            continue;
        };
        let name = format!("{}{}", series_name(g, many_jobs), suffix(g));
        let e = by.entry(name.clone()).or_insert(Series {
            name,
            pts: Vec::new(),
            bars: Vec::new(),
            line: true,
        });
        e.pts.push((x, m));
        e.bars.push((x, a.min(b), a.max(b)));
        if won(best, g) {
            marks.push((x, m));
        }
    }
    let mut series: Vec<Series> = by.into_values().collect();
    for s in &mut series {
        s.pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    (series, marks)
}

/// Plot 3: MiB read per token against `cache_mb`.
fn read_plot(
    groups: &[Group],
    best: &[Best],
    notes: &mut Vec<String>,
) -> Result<Option<Plot>, ReportError> {
    let (series, marks) = by_cache(groups, "read_mib_per_token", best, &|_, v| Some(v), &|_| {
        String::new()
    });
    if series.is_empty() {
        notes.push("read plot left out: no row measured read_mib_per_token".into());
        return Ok(None);
    }
    let title = "MiB read per token against cache_mb";
    Ok(Some(Plot {
        id: "read",
        title: title.into(),
        svg: chart(title, "cache_mb (MiB)", "MiB / token", &series, &marks)?,
    }))
}

/// Plot 4: RAM headroom (the profile's RAM minus peak RSS) against `cache_mb` where the RAM is
/// known, else peak RSS itself: a RAM line drawn beside RSS values thousands of times smaller would
/// flatten them onto the axis.
fn memory_plot(
    d: &Data,
    groups: &[Group],
    ram: &BTreeMap<String, f64>,
    best: &[Best],
    notes: &mut Vec<String>,
) -> Result<Option<Plot>, ReportError> {
    let known = groups
        .iter()
        .any(|g| g.metrics.contains_key("peak_rss_mib") && ram.contains_key(&g.profile));
    let (id, title, y_desc, (series, marks)) = if known {
        let mut without: Vec<&str> = groups
            .iter()
            .filter(|g| g.metrics.contains_key("peak_rss_mib") && !ram.contains_key(&g.profile))
            .map(|g| g.profile.as_str())
            .collect();
        without.dedup();
        if !without.is_empty() {
            notes.push(format!(
                "headroom plot: no RAM known for profile {} (give --profile-file), so it is left out of the plot",
                without.join(", ")
            ));
        }
        (
            "headroom",
            "RAM headroom (RAM - peak RSS) against cache_mb",
            "RAM - peak RSS, MiB",
            by_cache(
                groups,
                "peak_rss_mib",
                best,
                &|g, v| ram.get(&g.profile).map(|m| m - v),
                &|g| {
                    ram.get(&g.profile)
                        .map(|m| format!(" (RAM {} MiB)", tick(*m)))
                        .unwrap_or_default()
                },
            ),
        )
    } else {
        notes.push("memory plot: no profile RAM known (give --profile-file, or a ram_mb / mem_total_mib column), so it shows peak RSS, not the headroom".into());
        (
            "rss",
            "Peak RSS against cache_mb",
            "peak RSS MiB",
            by_cache(groups, "peak_rss_mib", best, &|_, v| Some(v), &|_| {
                String::new()
            }),
        )
    };
    if series.is_empty() {
        let why = if d.has("peak_rss_mib") {
            "no row measured peak_rss_mib".to_string()
        } else {
            "no input has a peak_rss_mib column (a build that records it is needed)".into()
        };
        notes.push(format!("{id} plot left out: {why}"));
        return Ok(None);
    }
    Ok(Some(Plot {
        id,
        title: title.into(),
        svg: chart(title, "cache_mb (MiB)", y_desc, &series, &marks)?,
    }))
}
