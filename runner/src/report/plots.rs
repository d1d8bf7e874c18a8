//! The report's plots, drawn with plotters' SVG backend (text as SVG `<text>`, sans-serif, no font
//! files): speed against the swept value, prefill time against prompt length, MiB read per token
//! and peak RSS against `cache_mb`.
use std::collections::BTreeMap;

use plotters::prelude::*;
use serde::Serialize;

use super::input::Data;
use super::stats::Group;
use super::ReportError;

/// One rendered plot.
#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    /// Stable id (`speed`, `prefill`, `read`, `rss`).
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

/// Draws one chart; `hlines` are horizontal reference lines (a profile's RAM).
fn chart(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    hlines: &[(String, f64)],
) -> Result<String, ReportError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let xs = series.iter().flat_map(|s| s.pts.iter().map(|p| p.0));
        let (x0, x1) = range(xs, false);
        let ys = series
            .iter()
            .flat_map(|s| {
                s.pts
                    .iter()
                    .map(|p| p.1)
                    .chain(s.bars.iter().flat_map(|b| [b.1, b.2]))
            })
            .chain(hlines.iter().map(|h| h.1));
        let (y0, y1) = range(ys, true);
        let mut ch = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err)?;
        ch.configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
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
            .map_err(plot_err)?
            .label(s.name.clone())
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
        }
        for (j, (name, y)) in hlines.iter().enumerate() {
            let c = COLORS[(series.len() + j) % COLORS.len()];
            let y = *y;
            ch.draw_series(LineSeries::new([(x0, y), (x1, y)], c.stroke_width(1)))
                .map_err(plot_err)?
                .label(name.clone())
                .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 16, yy)], c));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Series name for a group: the profile, prefixed with the job when several jobs are plotted.
fn series_name(g: &Group, many_jobs: bool) -> String {
    if many_jobs {
        format!("{} / {}", g.job, g.profile)
    } else {
        g.profile.clone()
    }
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

/// All plots the data allows, plus a note for each one it does not.
pub fn plots(
    d: &Data,
    groups: &[Group],
    ram: &BTreeMap<String, f64>,
) -> Result<(Vec<Plot>, Vec<String>), ReportError> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let many_jobs = groups.iter().any(|g| g.job != groups[0].job);

    // 1. Speed against the swept value (or the point's position when nothing numeric is swept).
    let key = swept_key(groups);
    let x_of = |gi: usize, g: &Group| -> f64 {
        key.as_ref()
            .and_then(|k| g.params.get(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(gi as f64)
    };
    let mut speed: BTreeMap<String, Series> = BTreeMap::new();
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
        }
    }
    if speed.is_empty() {
        notes.push("speed plot: no row measured prefill_tps or a decode rate".into());
    } else {
        let mut series: Vec<Series> = speed.into_values().collect();
        for s in &mut series {
            s.pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let xd = key
            .clone()
            .unwrap_or_else(|| "point (order of appearance)".into());
        out.push(Plot {
            id: "speed",
            title: format!("Speed against {xd} (median, p10..p90 bars)"),
            svg: chart(
                &format!("Speed against {xd}"),
                &xd,
                "tokens/s",
                &series,
                &[],
            )?,
        });
    }

    // 2. Prefill time against prompt length, device and CPU rows apart.
    let (mut dev, mut cpu) = (Vec::new(), Vec::new());
    for r in d.recs.iter().filter(|r| !r.failed) {
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
    if dev.is_empty() && cpu.is_empty() {
        notes.push("prefill plot: no row has n_prompt and prefill_s".into());
    } else {
        let mut series = Vec::new();
        for (name, pts) in [("CPU", cpu), ("device", dev)] {
            if !pts.is_empty() {
                series.push(Series {
                    name: format!("{name} ({} rows)", pts.len()),
                    pts,
                    bars: Vec::new(),
                    line: false,
                });
            }
        }
        out.push(Plot {
            id: "prefill",
            title: "Prefill time against prompt length".into(),
            svg: chart(
                "Prefill time against prompt length",
                "prompt tokens",
                "prefill s",
                &series,
                &[],
            )?,
        });
    }

    // 3 and 4. Per-group medians against the resolved cache budget.
    for (id, metric, title, y_desc) in [
        (
            "read",
            "read_mib_per_token",
            "MiB read per token against cache_mb",
            "MiB / token",
        ),
        (
            "rss",
            "peak_rss_mib",
            "Peak RSS against cache_mb",
            "peak RSS MiB",
        ),
    ] {
        if !d.has("cache_mb") {
            notes.push(format!("{id} plot: no cache_mb column"));
            continue;
        }
        let mut by: BTreeMap<String, Series> = BTreeMap::new();
        for g in groups {
            let (Some(x), Some(s)) = (g.cache_mb, g.metrics.get(metric)) else {
                continue;
            };
            let name = series_name(g, many_jobs);
            let e = by.entry(name.clone()).or_insert(Series {
                name,
                pts: Vec::new(),
                bars: Vec::new(),
                line: true,
            });
            e.pts.push((x, s.median));
            e.bars.push((x, s.p10, s.p90));
        }
        if by.is_empty() {
            let why = if d.has(metric) || metric != "peak_rss_mib" {
                format!("no row measured {metric}")
            } else {
                "no input has a peak_rss_mib column (a build that records it is needed)".into()
            };
            notes.push(format!("{id} plot left out: {why}"));
            continue;
        }
        let mut series: Vec<Series> = by.into_values().collect();
        for s in &mut series {
            s.pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let hlines: Vec<(String, f64)> = if id == "rss" {
            let mut profiles: Vec<&str> = groups.iter().map(|g| g.profile.as_str()).collect();
            profiles.dedup();
            let lines: Vec<(String, f64)> = profiles
                .iter()
                .filter_map(|p| ram.get(*p).map(|m| (format!("{p} RAM"), *m)))
                .collect();
            if lines.is_empty() {
                notes.push("rss plot: no profile RAM known (give --profile-file, or a ram_mb / mem_total_mib column)".into());
            }
            lines
        } else {
            Vec::new()
        };
        out.push(Plot {
            id,
            title: title.into(),
            svg: chart(title, "cache_mb (MiB)", y_desc, &series, &hlines)?,
        });
    }
    Ok((out, notes))
}
