//! Where the report's rows came from: hosts, CPUs, commits, models, the time span and the runs,
//! so a table cannot pass off one machine's numbers as another's.
use serde::Serialize;

use super::input::{Data, PROVENANCE};

/// The distinct provenance values over the rows reported on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Provenance {
    /// Host names.
    pub hosts: Vec<String>,
    /// CPU models, each with its CPU count (`AMD EPYC 7B13 (2 CPUs)`).
    pub cpus: Vec<String>,
    /// bmoe git commits.
    pub commits: Vec<String>,
    /// Models: path and the first 12 digits of the SHA-256.
    pub models: Vec<String>,
    /// Earliest and latest row time (RFC 3339), when rows carry `time`.
    pub from: Option<String>,
    /// See `from`.
    pub to: Option<String>,
    /// Run ids.
    pub runs: Vec<String>,
}

fn push(v: &mut Vec<String>, x: String) {
    if !x.is_empty() && !v.contains(&x) {
        v.push(x);
    }
}

impl Provenance {
    /// Collects the values over `d`'s rows (after `--job`/`--profile`/`--run-id`).
    pub fn of(d: &Data) -> Provenance {
        let at = |name: &str| PROVENANCE.iter().position(|c| *c == name);
        let (host, cpu, cores, commit, model, sha, time) = (
            at("host"),
            at("cpu_model"),
            at("cpu_cores"),
            at("git_commit"),
            at("model"),
            at("model_sha256"),
            at("time"),
        );
        let cell = |r: &super::input::Rec, i: Option<usize>| {
            i.and_then(|i| r.prov.get(i)).cloned().unwrap_or_default()
        };
        let mut p = Provenance::default();
        for r in &d.recs {
            push(&mut p.hosts, cell(r, host));
            let (c, n) = (cell(r, cpu), cell(r, cores));
            push(
                &mut p.cpus,
                match (c.is_empty(), n.is_empty()) {
                    (true, true) => String::new(),
                    (false, true) => c,
                    (true, false) => format!("{n} CPUs"),
                    (false, false) => format!("{c} ({n} CPUs)"),
                },
            );
            push(&mut p.commits, cell(r, commit));
            let (m, s) = (cell(r, model), cell(r, sha));
            let short: String = s.chars().take(12).collect();
            push(
                &mut p.models,
                match (m.is_empty(), short.is_empty()) {
                    (_, true) => m,
                    (true, false) => format!("sha256 {short}"),
                    (false, false) => format!("{m} (sha256 {short})"),
                },
            );
            push(&mut p.runs, r.run_id.clone());
            // RFC 3339 UTC times order as text.
            let t = cell(r, time);
            if !t.is_empty() {
                if p.from.as_ref().is_none_or(|f| t < *f) {
                    p.from = Some(t.clone());
                }
                if p.to.as_ref().is_none_or(|f| t > *f) {
                    p.to = Some(t);
                }
            }
        }
        p
    }

    /// The header as (label, text) lines; a field no row carries reads `unknown`.
    pub fn lines(&self) -> Vec<(&'static str, String)> {
        let list = |v: &[String]| {
            if v.is_empty() {
                "unknown (the CSVs lack the column)".to_string()
            } else {
                v.join(", ")
            }
        };
        let dates = match (&self.from, &self.to) {
            (Some(f), Some(t)) if f == t => f.clone(),
            (Some(f), Some(t)) => format!("{f} .. {t}"),
            _ => "unknown (the CSVs lack the column)".into(),
        };
        vec![
            ("hosts", list(&self.hosts)),
            ("CPUs", list(&self.cpus)),
            ("commits", list(&self.commits)),
            ("models", list(&self.models)),
            ("dates", dates),
            ("runs", list(&self.runs)),
        ]
    }
}
