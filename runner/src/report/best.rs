//! `--best`: the winning point under an objective and requirements, why every other point lost,
//! the points it cannot be told from (their objective's 95% intervals overlap the winner's), and
//! the winner written back as a TOML overlay (`--write-overrides`).
use std::fmt::Write as _;

use serde::Serialize;

use super::error::ReportError;
use super::group::Group;
use super::input::Data;
use super::metrics::{
    known_name, lower_is_better, scalar, scalar_interval, unknown_name_hint, METRICS,
};

/// A comparison in a `--require`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    /// `<=`
    Le,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `>`
    Gt,
    /// `==` or `=`
    Eq,
}

impl Op {
    fn text(self) -> &'static str {
        match self {
            Op::Le => "<=",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Gt => ">",
            Op::Eq => "==",
        }
    }
    fn holds(self, v: f64, bound: f64) -> bool {
        match self {
            Op::Le => v <= bound,
            Op::Ge => v >= bound,
            Op::Lt => v < bound,
            Op::Gt => v > bound,
            Op::Eq => (v - bound).abs() <= 1e-9 * bound.abs().max(1.0),
        }
    }
}

/// One `--require NAME OP NUMBER`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Require {
    /// Metric or column.
    pub name: String,
    /// Comparison.
    pub op: Op,
    /// Bound.
    pub bound: f64,
}

impl std::fmt::Display for Require {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}{}", self.name, self.op.text(), fmt_num(self.bound))
    }
}

/// Parses `peak_rss_mib<=6000` (several may be joined by commas).
pub fn parse_requires(arg: &str) -> Result<Vec<Require>, ReportError> {
    let mut out = Vec::new();
    for part in arg.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // Two-character operators first, so `<=` is not read as `<`.
        let ops = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("==", Op::Eq),
            ("<", Op::Lt),
            (">", Op::Gt),
            ("=", Op::Eq),
        ];
        let found = ops
            .iter()
            .filter_map(|(t, op)| part.find(t).map(|i| (i, *t, *op)))
            .min_by_key(|(i, t, _)| (*i, usize::MAX - t.len()));
        let Some((i, t, op)) = found else {
            return Err(ReportError::BadRequire {
                arg: part.to_string(),
                detail: "expected NAME<=N, NAME>=N, NAME<N, NAME>N or NAME==N".into(),
            });
        };
        let name = part[..i].trim();
        let value = part[i + t.len()..].trim();
        let bound: f64 = value.parse().map_err(|_| ReportError::BadRequire {
            arg: part.to_string(),
            detail: format!("expected a number after {t}, found {value:?}"),
        })?;
        if name.is_empty() {
            return Err(ReportError::BadRequire {
                arg: part.to_string(),
                detail: "expected a metric or column name before the comparison".into(),
            });
        }
        out.push(Require {
            name: name.to_string(),
            op,
            bound,
        });
    }
    Ok(out)
}

/// How the best point is chosen.
#[derive(Debug, Clone)]
pub struct BestSpec {
    /// The metric or column to optimise.
    pub objective: String,
    /// Lower wins (default from the name: times, MiB, read per token).
    pub minimize: bool,
    /// Every requirement a point must meet.
    pub requires: Vec<Require>,
}

/// Why a point lost.
#[derive(Debug, Clone, Serialize)]
pub struct Loser {
    /// Job.
    pub job: String,
    /// Profile.
    pub profile: String,
    /// Point.
    pub point: String,
    /// Its objective value, if measured.
    pub objective: Option<f64>,
    /// The objective's 95% interval, where one is computed.
    pub interval: Option<Interval>,
    /// It met every requirement and its interval overlaps the winner's: the rows cannot tell the
    /// two apart.
    pub not_distinguishable: bool,
    /// Human reason.
    pub reason: String,
}

/// A 95% interval of an objective value (bootstrap of the median over a point's rows; of the
/// mean over items for `accuracy`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Interval {
    /// Whether the two share a value.
    fn overlaps(&self, o: &Interval) -> bool {
        self.low <= o.high && o.low <= self.high
    }
}

/// The winner of one (job, profile).
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    /// Job.
    pub job: String,
    /// Profile.
    pub profile: String,
    /// Winning point label.
    pub point: String,
    /// Its swept values (what `--write-overrides` writes).
    #[serde(serialize_with = "super::group::typed_params")]
    pub params: std::collections::BTreeMap<String, String>,
    /// Settings the swept values depend on to act, as the point ran with them (`moe_stream` for
    /// `cache_mb`): written beside the swept values, so the overlay reproduces the point.
    #[serde(serialize_with = "super::group::typed_params")]
    pub depends: std::collections::BTreeMap<String, String>,
    /// Objective name.
    pub objective: String,
    /// `max` or `min`.
    pub direction: &'static str,
    /// The winner's objective value.
    pub value: f64,
    /// Its 95% interval, where one is computed.
    pub interval: Option<Interval>,
    /// The points that met every requirement and whose objective's interval overlaps the
    /// winner's: as good as far as the rows can tell.
    pub not_distinguishable_from: Vec<String>,
    /// Each requirement with the winner's value.
    pub requires: Vec<(String, f64)>,
    /// Every other point of the (job, profile), and why it lost.
    pub others: Vec<Loser>,
}

/// Checks names against the inputs before choosing.
pub fn validate(d: &Data, spec: &BestSpec) -> Result<(), ReportError> {
    if !known_name(d, &spec.objective) {
        return Err(ReportError::UnknownName {
            flag: "--objective",
            name: spec.objective.clone(),
            known: unknown_name_hint(d, &spec.objective),
        });
    }
    for r in &spec.requires {
        if !known_name(d, &r.name) {
            return Err(ReportError::UnknownName {
                flag: "--require",
                name: r.name.clone(),
                known: unknown_name_hint(d, &r.name),
            });
        }
    }
    Ok(())
}

/// Refuses an objective that no point of a (job, profile) measures, before any requirement is
/// judged: every point would lose with "not measured", which hides the real cause.
fn objective_measured(d: &Data, gs: &[&Group], objective: &str) -> Result<(), ReportError> {
    if gs.iter().any(|g| scalar(d, g, objective).is_some()) {
        return Ok(());
    }
    let rows = || {
        gs.iter()
            .flat_map(|g| g.members.iter().map(|&i| &d.recs[i]))
    };
    let kind = if rows().any(|r| r.best.is_some()) {
        " (a decide job)"
    } else if rows().any(|r| d.num(r, "ppl").is_some()) {
        " (a perplexity job)"
    } else {
        ""
    };
    let why = match objective {
        "decode_tps" | "decode_tps_p10" | "decode_tps_p90" => format!("decodes{kind}"),
        "read_mib_per_token" => "streams experts (moe_stream off)".into(),
        "cache_hit_pct" => "looked up the expert cache (moe_stream off)".into(),
        "dev_wait_share" => "ran prefill on a device".into(),
        "accuracy" => "carries `correct` or `expected`".into(),
        "agreement" => "has a `best` its reference point also has".into(),
        "ppl_change" => "has a `ppl` for an item its reference point also scored".into(),
        _ => "measures it".into(),
    };
    let measured = |m: &str| gs.iter().any(|g| g.metrics.contains_key(m));
    let mut try_: Vec<&str> = ["prefill_tps", "decode_tps", "read_mib_per_token"]
        .into_iter()
        .filter(|m| measured(m))
        .collect();
    if try_.is_empty() {
        try_ = METRICS
            .iter()
            .map(|(m, _, _)| *m)
            .filter(|m| measured(m))
            .collect();
    }
    let try_instead = match try_.split_last() {
        None => "another column (none of the report's metrics was measured)".into(),
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    };
    Err(ReportError::ObjectiveUnmeasured {
        objective: objective.to_string(),
        job: gs.first().map(|g| g.job.clone()).unwrap_or_default(),
        profile: gs.first().map(|g| g.profile.clone()).unwrap_or_default(),
        why,
        try_instead,
    })
}

/// The default direction for an objective name.
pub fn default_minimize(name: &str) -> bool {
    lower_is_better(name)
}

fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.4}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// Picks the best point of each (job, profile); an error naming the closest point when no point
/// of some pair meets every requirement.
pub fn choose(d: &Data, groups: &[Group], spec: &BestSpec) -> Result<Vec<Best>, ReportError> {
    validate(d, spec)?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    for g in groups {
        let p = (g.job.clone(), g.profile.clone());
        if !pairs.contains(&p) {
            pairs.push(p);
        }
    }
    let mut out = Vec::new();
    for (job, profile) in pairs {
        let gs: Vec<&Group> = groups
            .iter()
            .filter(|g| g.job == job && g.profile == profile)
            .collect();
        objective_measured(d, &gs, &spec.objective)?;
        let judged: Vec<Judged> = gs.iter().map(|g| judge(d, g, spec)).collect();
        let Some(w) = winner(&judged, spec.minimize) else {
            return Err(none_meets(job, profile, &judged, spec));
        };
        out.push(best_of(d, &judged, w, spec));
    }
    Ok(out)
}

/// One point judged: its objective value, the requirements it fails (as text) and its total
/// relative shortfall (to name the closest when none qualifies).
struct Judged<'a> {
    group: &'a Group,
    objective: Option<f64>,
    interval: Option<Interval>,
    fails: Vec<String>,
    shortfall: f64,
}

/// Judges one point against the objective and every requirement.
fn judge<'a>(d: &Data, g: &'a Group, spec: &BestSpec) -> Judged<'a> {
    let objective = scalar(d, g, &spec.objective);
    let mut fails = Vec::new();
    let mut shortfall = 0.0;
    for r in &spec.requires {
        match scalar(d, g, &r.name) {
            Some(v) if r.op.holds(v, r.bound) => {}
            Some(v) => {
                fails.push(format!("{} is {} (needs {r})", r.name, fmt_num(v)));
                shortfall += (v - r.bound).abs() / r.bound.abs().max(1e-9);
            }
            None => {
                fails.push(format!("{} not measured (needs {r})", r.name));
                shortfall += f64::INFINITY;
            }
        }
    }
    if objective.is_none() {
        fails.push(format!("{} not measured", spec.objective));
    }
    Judged {
        group: g,
        objective,
        interval: scalar_interval(d, g, &spec.objective).map(|(low, high)| Interval { low, high }),
        fails,
        shortfall,
    }
}

/// The index of the best qualifying point; of equals, the earlier.
fn winner(judged: &[Judged], minimize: bool) -> Option<usize> {
    let better = |a: f64, b: f64| if minimize { a < b } else { a > b };
    let mut win: Option<usize> = None;
    for (i, j) in judged.iter().enumerate() {
        let (Some(v), true) = (j.objective, j.fails.is_empty()) else {
            continue;
        };
        match win {
            Some(w) if !better(v, judged[w].objective.unwrap_or(f64::NAN)) => {}
            _ => win = Some(i),
        }
    }
    win
}

/// No point qualifies: the error names the one that came closest.
fn none_meets(job: String, profile: String, judged: &[Judged], spec: &BestSpec) -> ReportError {
    let closest = judged
        .iter()
        .min_by(|a, b| a.shortfall.total_cmp(&b.shortfall))
        .map(|j| format!("{} ({})", j.group.label, j.fails.join("; ")))
        .unwrap_or_default();
    ReportError::NoPointMeets {
        job,
        profile,
        requires: spec
            .requires
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        closest,
    }
}

/// The winner `w` with every other point and why it lost.
fn best_of(d: &Data, judged: &[Judged], w: usize, spec: &BestSpec) -> Best {
    let wg = judged[w].group;
    let wv = judged[w].objective.unwrap_or(f64::NAN);
    let wi = judged[w].interval;
    let others: Vec<Loser> = judged
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != w)
        .map(|(_, j)| {
            let close = tied_within_noise(j, wi);
            let mut reason = lost_because(j, wv, &spec.objective);
            if close {
                reason.push_str("; not distinguishable: the 95% intervals overlap");
            }
            Loser {
                job: j.group.job.clone(),
                profile: j.group.profile.clone(),
                point: j.group.label.clone(),
                objective: j.objective,
                interval: j.interval,
                not_distinguishable: close,
                reason,
            }
        })
        .collect();
    Best {
        job: wg.job.clone(),
        profile: wg.profile.clone(),
        point: wg.label.clone(),
        params: wg.params.clone(),
        depends: dependencies(&wg.params, &wg.settings),
        objective: spec.objective.clone(),
        direction: if spec.minimize { "min" } else { "max" },
        value: wv,
        interval: wi,
        not_distinguishable_from: others
            .iter()
            .filter(|o| o.not_distinguishable)
            .map(|o| o.point.clone())
            .collect(),
        requires: spec
            .requires
            .iter()
            .map(|r| (r.to_string(), scalar(d, wg, &r.name).unwrap_or(f64::NAN)))
            .collect(),
        others,
    }
}

/// The settings the swept keys `params` depend on to act (the inert rule's
/// [`crate::config::inert::depends_on`]), with the values the point ran with; keys swept
/// themselves are left out.
fn dependencies(
    params: &std::collections::BTreeMap<String, String>,
    ran_with: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    params
        .keys()
        .flat_map(|k| crate::config::inert::depends_on(k))
        .filter(|dep| !params.contains_key(*dep))
        .filter_map(|dep| Some((dep.to_string(), ran_with.get(dep)?.clone())))
        .collect()
}

/// Whether a point that met every requirement cannot be told from the winner: both objectives
/// have an interval and the two overlap. (Overlapping 95% intervals is a cautious test: two
/// points may differ and still overlap, never the other way round.)
fn tied_within_noise(j: &Judged, winner: Option<Interval>) -> bool {
    match (j.interval, winner) {
        (Some(a), Some(b)) => j.fails.is_empty() && a.overlaps(&b),
        _ => false,
    }
}

/// Why a point lost to the winner's value `wv`: its failed requirements, else its objective
/// against the winner's.
fn lost_because(j: &Judged, wv: f64, objective: &str) -> String {
    if !j.fails.is_empty() {
        return j.fails.join("; ");
    }
    let v = j.objective.unwrap_or(f64::NAN);
    let pct = if wv != 0.0 {
        (v - wv) / wv.abs() * 100.0
    } else {
        0.0
    };
    if wv == 0.0 && v != 0.0 {
        format!("{objective} {} vs {}", fmt_num(v), fmt_num(wv))
    } else if v == wv {
        format!("{objective} {} ties; the earlier point wins", fmt_num(v))
    } else {
        format!("{objective} {} vs {} ({pct:+.1}%)", fmt_num(v), fmt_num(wv))
    }
}

/// The winners as text for the terminal.
pub fn render(bests: &[Best]) -> String {
    let mut s = String::new();
    for b in bests {
        let _ = writeln!(
            s,
            "best point for job {} on profile {}: {}",
            b.job, b.profile, b.point
        );
        let interval = b.interval.map_or(String::new(), |i| {
            format!(", 95% interval [{}, {}]", fmt_num(i.low), fmt_num(i.high))
        });
        let _ = writeln!(
            s,
            "  {} = {}{interval} ({} is better)",
            b.objective,
            fmt_num(b.value),
            if b.direction == "min" {
                "lower"
            } else {
                "higher"
            }
        );
        if !b.not_distinguishable_from.is_empty() {
            let _ = writeln!(
                s,
                "  not distinguishable from: {} (95% intervals of {} overlap the winner's; more items or --repeat N may separate them)",
                b.not_distinguishable_from.join(", "),
                b.objective
            );
        }

        for (r, v) in &b.requires {
            let _ = writeln!(s, "  meets {r}: {}", fmt_num(*v));
        }
        for o in &b.others {
            let _ = writeln!(s, "  lost: {}: {}", o.point, o.reason);
        }
    }
    s
}

/// The winner as a TOML overlay of layered keys, for `--overrides FILE` on check/plan/run.
pub fn overlay_toml(b: &Best, how: &str) -> Result<String, ReportError> {
    if b.params.is_empty() {
        return Err(ReportError::NothingSwept {
            point: b.point.clone(),
        });
    }
    let table = toml_table(&b.params);
    let body = toml::to_string(&table).map_err(|e| ReportError::Overlay(e.to_string()))?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Written by `{how}`: the best point of job {} on profile {}.",
        b.job, b.profile
    );
    let _ = writeln!(
        s,
        "# Point {}: {} = {} ({}).",
        b.point,
        b.objective,
        fmt_num(b.value),
        if b.direction == "min" {
            "lowest"
        } else {
            "highest"
        }
    );
    for (r, v) in &b.requires {
        let _ = writeln!(s, "# Meets {r} ({}).", fmt_num(*v));
    }
    // The swept values, and what they need to act; the rest of the job's [overrides] stays in
    // the job file.
    s.push_str(
        "# The swept values, then the settings they depend on as the point ran with them;\n",
    );
    s.push_str("# the job's other [overrides] are not repeated here.\n");
    s.push_str("# Use it with: bmoe check|plan|run JOB --overrides THIS_FILE\n");
    s.push_str(&body);
    if !b.depends.is_empty() {
        let deps = toml::to_string(&toml_table(&b.depends))
            .map_err(|e| ReportError::Overlay(e.to_string()))?;
        let needed: Vec<String> = b
            .params
            .keys()
            .filter(|k| !crate::config::inert::depends_on(k).is_empty())
            .cloned()
            .collect();
        let _ = writeln!(s, "# What {} needs to act, as measured:", needed.join(", "));
        s.push_str(&deps);
    }
    Ok(s)
}

/// Values as a point label or a `settings` cell spells them (numbers and booleans bare, strings
/// unquoted) as a TOML table of the same types.
fn toml_table(values: &std::collections::BTreeMap<String, String>) -> toml::Table {
    let mut table = toml::Table::new();
    for (k, v) in values {
        let val = match serde_json::from_str::<serde_json::Value>(v) {
            Ok(serde_json::Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => toml::Value::Integer(i),
                (None, Some(f)) => toml::Value::Float(f),
                _ => toml::Value::String(v.clone()),
            },
            Ok(serde_json::Value::Bool(x)) => toml::Value::Boolean(x),
            _ => toml::Value::String(v.clone()),
        };
        table.insert(k.clone(), val);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requires_parse() {
        let r = parse_requires("peak_rss_mib<=6000, agreement>=0.99").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].op, Op::Le);
        assert_eq!(r[0].bound, 6000.0);
        assert_eq!(r[1].name, "agreement");
        assert_eq!(r[1].op, Op::Ge);
        assert_eq!(parse_requires("rows=3").unwrap()[0].op, Op::Eq);
        assert!(parse_requires("agreement").is_err());
        assert!(parse_requires("agreement>=lots").is_err());
        assert!(parse_requires(">=1").is_err());
    }
}
