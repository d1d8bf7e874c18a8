//! The report as Markdown (terminals, pull requests), one self-contained HTML page (inline SVG, no
//! script, no font or anything else from the network) or JSON (dashboards).
use std::fmt::Write as _;

use comfy_table::{presets::ASCII_MARKDOWN, Table};
use serde_json::json;

use super::best::render as render_best;
use super::group::{Agreement, Floor, Group, PplChange, Speedup, Stat};
use super::metrics::METRICS;
use super::Report;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One HTML file.
    Html,
    /// Markdown.
    Md,
    /// JSON.
    Json,
}

/// Renders `r` in `f`.
pub fn render(r: &Report, f: Format) -> String {
    match f {
        Format::Html => html(r),
        Format::Md => markdown(r),
        Format::Json => json_text(r),
    }
}

fn num(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn stat_cell(s: Option<&Stat>) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{} ({}..{})", num(s.median), num(s.p10), num(s.p90)),
        Some(s) => num(s.median),
        None => "-".into(),
    }
}

/// (job, profile) pairs in first-seen order, each with its groups.
fn tables(r: &Report) -> Vec<((String, String), Vec<&Group>)> {
    let mut out: Vec<((String, String), Vec<&Group>)> = Vec::new();
    for g in &r.groups {
        let k = (g.job.clone(), g.profile.clone());
        match out.iter_mut().find(|(kk, _)| *kk == k) {
            Some((_, v)) => v.push(g),
            None => out.push((k, vec![g])),
        }
    }
    out
}

/// The rows cell: `24 (8 items x 3 repeats)`, so repeats are not read as more rows.
fn rows_cell(g: &Group) -> String {
    let mut t = format!("{}", g.rows);
    match g.repeats {
        Some(n) if n > 1 && g.items * n as usize == g.rows => {
            let _ = write!(t, " ({} items x {n} repeats)", g.items);
        }
        Some(n) if n > 1 => {
            let _ = write!(t, " ({} items, up to {n} repeats)", g.items);
        }
        _ => {}
    }
    if g.errors > 0 {
        let _ = write!(t, ", {} refused", g.errors);
    }
    t
}

/// `0.750 ± 0.164 (n=8 items)`, and against the reference point `; -0.125 [-0.375, +0.125]`.
fn accuracy_cell(g: &Group) -> String {
    let mut cell = match &g.accuracy {
        Some(a) => match a.stderr {
            Some(se) => format!("{:.3} ± {:.3} (n={} items)", a.value, se, a.n),
            None => format!("{:.3} (n={} item)", a.value, a.n),
        },
        None => return "-".into(),
    };
    if let Some(c) = &g.accuracy_change {
        let c = &c.change;
        let _ = write!(cell, "; {:+.3} [{:+.3}, {:+.3}]", c.change, c.low, c.high);
    }
    cell
}

/// Whether `g` is the `--best` winner of its (job, profile).
pub fn is_best(r: &Report, g: &Group) -> bool {
    r.best
        .iter()
        .any(|b| b.job == g.job && b.profile == g.profile && b.point == g.label)
}

/// Header and cells of one (job, profile) table: metric columns no group measured are left out.
fn table_rows(r: &Report, gs: &[&Group]) -> (Vec<String>, Vec<Vec<String>>) {
    let cols = Columns::of(r, gs);
    (cols.head(), gs.iter().map(|g| cols.cells(r, g)).collect())
}

/// A speed-up cell: the ratio with its 95% interval, `-` where the point has none.
fn speedup_cell(s: Option<&Speedup>) -> String {
    s.map_or("-".into(), |s| match (s.low, s.high) {
        (Some(lo), Some(hi)) => format!("{:.2}x [{lo:.2}, {hi:.2}]", s.value),
        _ => format!("{:.2}x", s.value),
    })
}

/// A floor cell: decode over its floor with the 95% interval, then the parts in ms a token.
fn floor_cell(f: &Floor) -> String {
    format!(
        "{:.2}x [{:.2}, {:.2}] ({:.1} ms / ({:.1} + {:.1}))",
        f.value, f.low, f.high, f.decode_ms, f.read_ms, f.compute_ms
    )
}

/// The columns of one (job, profile) table: what at least one of its groups measured.
struct Columns<'a> {
    metrics: Vec<&'static (&'static str, &'static str, &'static str)>,
    accuracy: bool,
    agreement: Option<&'a Agreement>,
    speedup: Option<&'a Speedup>,
    prefill_speedup: Option<&'a Speedup>,
    floor: Option<&'a Floor>,
    ppl: Option<&'a PplChange>,
    headroom: bool,
}

impl<'a> Columns<'a> {
    fn of(r: &Report, gs: &[&'a Group]) -> Self {
        Columns {
            metrics: METRICS
                .iter()
                .filter(|(m, _, _)| gs.iter().any(|g| g.metrics.contains_key(*m)))
                .collect(),
            accuracy: gs.iter().any(|g| g.accuracy.is_some()),
            agreement: gs.iter().find_map(|g| g.agreement.as_ref()),
            speedup: gs.iter().find_map(|g| g.speedup.as_ref()),
            prefill_speedup: gs.iter().find_map(|g| g.prefill_speedup.as_ref()),
            floor: gs.iter().find_map(|g| g.floor.as_ref()),
            ppl: gs.iter().find_map(|g| g.ppl_change.as_ref()),
            headroom: gs
                .iter()
                .any(|g| g.metrics.contains_key("peak_rss_mib") && r.ram.contains_key(&g.profile)),
        }
    }

    fn head(&self) -> Vec<String> {
        let mut head = vec!["point".to_string(), "rows".to_string()];
        head.extend(self.metrics.iter().map(|(_, h, _)| h.to_string()));
        for s in [self.prefill_speedup, self.speedup].into_iter().flatten() {
            let what = match s.metric.as_str() {
                "decisions_per_s" => "decisions/s",
                m => m.trim_end_matches("_tps"),
            };
            head.push(format!("{what} speed-up vs {}", s.reference));
        }
        if let Some(f) = self.floor {
            head.push(format!("decode x floor (read + {})", f.reference));
        }
        if self.headroom {
            head.push("RAM headroom MiB".into());
        }
        if self.accuracy {
            head.push("accuracy".into());
        }
        if let Some(a) = self.agreement {
            head.push(format!("agreement vs {}", a.reference));
        }
        if let Some(p) = self.ppl {
            head.push(format!("ppl vs {} (worst item)", p.reference));
        }
        head
    }

    fn cells(&self, r: &Report, g: &Group) -> Vec<String> {
        let label = if is_best(r, g) {
            format!("{} (best)", g.label)
        } else {
            g.label.clone()
        };
        let mut cells = vec![label, rows_cell(g)];
        cells.extend(
            self.metrics
                .iter()
                .map(|(m, _, _)| stat_cell(g.metrics.get(*m))),
        );
        if self.prefill_speedup.is_some() {
            cells.push(speedup_cell(g.prefill_speedup.as_ref()));
        }
        if self.speedup.is_some() {
            cells.push(speedup_cell(g.speedup.as_ref()));
        }
        if self.floor.is_some() {
            cells.push(g.floor.as_ref().map_or("-".into(), floor_cell));
        }
        if self.headroom {
            let h = g
                .metrics
                .get("peak_rss_mib")
                .zip(r.ram.get(&g.profile))
                .map(|(s, ram)| num(ram - s.median));
            cells.push(h.unwrap_or("-".into()));
        }
        if self.accuracy {
            cells.push(accuracy_cell(g));
        }
        if self.agreement.is_some() {
            cells.push(
                g.agreement
                    .as_ref()
                    .map(|a| format!("{:.3} (n={})", a.value, a.n))
                    .unwrap_or("-".into()),
            );
        }
        if self.ppl.is_some() {
            cells.push(g.ppl_change.as_ref().map_or("-".into(), |p| {
                format!(
                    "{:+.3}% ({:+.3}%, n={})",
                    100.0 * p.value,
                    100.0 * p.worst,
                    p.n
                )
            }));
        }
        cells
    }
}

fn markdown(r: &Report) -> String {
    let mut s = String::from("# bmoe report\n\n");
    for i in &r.inputs {
        let _ = writeln!(s, "- input `{}`: {} rows", i.path, i.rows);
    }
    for (k, v) in r.provenance.lines() {
        let _ = writeln!(s, "- {k}: {v}");
    }
    s.push_str("\nCells: median (p10..p90) over the group's rows; `-` = not measured; accuracy: mean over items of each item's repeats, ± lm-eval's standard error; then the change against the reference point over the items both have, with its 95% interval (paired bootstrap, 2000 resamples, fixed seed: as `bmoe compare`); speed-up: the median over the reference's, with its 95% interval [low, high] (bootstrap, each point's rows resampled apart); decode x floor (a streamed point with `disk_probe`): its median decode time a token over the floor, decode's own reads a token at the rate probed before it plus the reference's median decode time a token, with its 95% interval and the three in ms.\n");
    for ((job, profile), gs) in tables(r) {
        let _ = writeln!(s, "\n## job {job} on profile {profile}\n");
        let (head, rows) = table_rows(r, &gs);
        let mut t = Table::new();
        t.load_style(ASCII_MARKDOWN).set_header(head);
        for row in rows {
            t.add_row(row);
        }
        let _ = writeln!(s, "{t}");
    }
    if !r.best.is_empty() {
        s.push_str("\n## Best point\n\n```\n");
        s.push_str(&render_best(&r.best));
        s.push_str("```\n");
    }
    if !r.notes.is_empty() {
        s.push_str("\n## Notes\n\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s.push_str("\n## Metrics\n\n");
    for (m, h, what) in METRICS {
        let _ = writeln!(s, "- {h} (`{m}`): {what}");
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escapes text for HTML and shows `code` spans (the notes' Markdown) as `<code>`.
fn esc_code(s: &str) -> String {
    esc(s)
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                format!("<code>{part}</code>")
            } else {
                part.to_string()
            }
        })
        .collect()
}

fn html(r: &Report) -> String {
    let mut s = String::new();
    html_head(&mut s, r);
    html_tables(&mut s, r);
    html_best_and_plots(&mut s, r);
    html_notes_and_metrics(&mut s, r);
    s.push_str("</ul>\n</body>\n</html>\n");
    s
}

/// The page's head and its opening list: the inputs and where the rows came from.
fn html_head(s: &mut String, r: &Report) {
    s.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    // Nothing may load from anywhere: the page is read offline and attached to e-mails.
    s.push_str("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n");
    let _ = writeln!(
        s,
        "<meta name=\"bmoe-plots\" content=\"{}\">",
        r.plots.len()
    );
    s.push_str("<title>bmoe report</title>\n<style>\n");
    s.push_str("body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1100px}\n");
    s.push_str("table{border-collapse:collapse;margin:.5em 0 1.5em}\n");
    s.push_str("th,td{border:1px solid #bbb;padding:3px 8px;text-align:right;font-size:14px}\n");
    s.push_str("th{background:#eee}td:first-child{text-align:left}\n");
    s.push_str("tr.best td{background:#fff3c4;font-weight:bold}\n");
    s.push_str("figure{margin:1em 0}figcaption{font-size:14px;color:#555}\n");
    s.push_str("pre{background:#f6f6f6;padding:.6em}\n</style>\n</head>\n<body>\n");
    s.push_str("<h1>bmoe report</h1>\n<ul>\n");
    for i in &r.inputs {
        let _ = writeln!(
            s,
            "<li>input <code>{}</code>: {} rows</li>",
            esc(&i.path),
            i.rows
        );
    }
    for (k, v) in r.provenance.lines() {
        let _ = writeln!(s, "<li>{}: {}</li>", esc(k), esc(&v));
    }
    s.push_str("</ul>\n<p>Cells: median (p10..p90) over the group's rows; - = not measured; speed-up: the median over the reference's, with its 95% interval [low, high]; decode x floor: decode's time a token over (its reads at the probed disk rate + the reference's decode time a token).</p>\n");
}

/// One table per (job, profile), the best point's row marked.
fn html_tables(s: &mut String, r: &Report) {
    for ((job, profile), gs) in tables(r) {
        let _ = writeln!(s, "<h2>job {} on profile {}</h2>", esc(&job), esc(&profile));
        let (head, rows) = table_rows(r, &gs);
        s.push_str("<table>\n<tr>");
        for h in head {
            let _ = write!(s, "<th>{}</th>", esc(&h));
        }
        s.push_str("</tr>\n");
        for (g, row) in gs.iter().zip(rows) {
            s.push_str(if is_best(r, g) {
                "<tr class=\"best\">"
            } else {
                "<tr>"
            });
            for c in row {
                let _ = write!(s, "<td>{}</td>", esc(&c));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n");
    }
}

/// The best point and the plots, inline.
fn html_best_and_plots(s: &mut String, r: &Report) {
    if !r.best.is_empty() {
        let _ = writeln!(
            s,
            "<h2>Best point</h2>\n<pre>{}</pre>",
            esc(&render_best(&r.best))
        );
    }
    if !r.plots.is_empty() {
        s.push_str("<h2>Plots</h2>\n");
    }
    for p in &r.plots {
        // plotters writes a standalone document: drop its XML prolog to inline it.
        let svg = match p.svg.find("<svg") {
            Some(i) => &p.svg[i..],
            None => p.svg.as_str(),
        };
        let _ = writeln!(
            s,
            "<figure id=\"plot-{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>",
            p.id,
            svg,
            esc(&p.title)
        );
    }
}

/// The notes and what each metric is (the list is closed by the caller).
fn html_notes_and_metrics(s: &mut String, r: &Report) {
    if !r.notes.is_empty() {
        s.push_str("<h2>Notes</h2>\n<ul>\n");
        for n in &r.notes {
            let _ = writeln!(s, "<li>{}</li>", esc_code(n));
        }
        s.push_str("</ul>\n");
    }
    s.push_str("<h2>Metrics</h2>\n<ul>\n");
    for (m, h, what) in METRICS {
        let _ = writeln!(
            s,
            "<li>{} (<code>{}</code>): {}</li>",
            esc(h),
            esc(m),
            esc_code(what)
        );
    }
}

fn json_text(r: &Report) -> String {
    let v = json!({
        "format": "bmoe-report",
        // 2: `params` typed, `provenance`, split groups (`label`, `differs`), accuracy per item.
        "version": 2,
        "inputs": r.inputs,
        "provenance": r.provenance,
        "notes": r.notes,
        "metrics": METRICS.iter().map(|(m, h, what)| json!({"name": m, "heading": h, "meaning": what})).collect::<Vec<_>>(),
        "groups": r.groups,
        "plots": r.plots,
        "profile_ram_mib": r.ram,
        "best": r.best,
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into())
    )
}
