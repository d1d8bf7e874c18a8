//! What every unit of a run shares (`Ctx`) and what it writes and counts as it goes (`Out`).
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::summary::Summary;
use super::RunOptions;
use crate::ident::{self, Machine};
use crate::run::machine;
use crate::run::prepare::Prepared;
use crate::run::progress::Progress;
use crate::run::signals::Stop;
use crate::sink::csv::{CsvSink, Target};
use crate::sink::key::RowKey;
use crate::sink::row::Row;

/// What every unit of a run shares, fixed before the first unit.
pub(super) struct Ctx<'a> {
    pub(super) prep: &'a Prepared,
    pub(super) opts: &'a RunOptions,
    pub(super) stop: &'a Stop,
    pub(super) run_id: String,
    /// The keys the run already has.
    pub(super) done: HashSet<RowKey>,
    /// Under `--retry-errors`, the only keys to run.
    pub(super) retry: Option<HashSet<RowKey>>,
    pub(super) targets: HashMap<PathBuf, Target>,
    pub(super) machine_id: Machine,
    pub(super) model_sha: HashMap<PathBuf, String>,
    pub(super) build: String,
    pub(super) rss: ident::RssPeaks,
}

/// The `build` every row names: this runner's version and the engine's.
pub(super) fn build_label() -> String {
    format!(
        "bmoe {} (engine {})",
        env!("CARGO_PKG_VERSION"),
        bmoe_engine::VERSION
    )
}

impl Ctx<'_> {
    /// The file a CSV's rows are written to (a rotated CSV's next file, or the CSV itself).
    pub(super) fn write_to(&self, csv: &Path) -> PathBuf {
        self.targets
            .get(csv)
            .map(|t| t.write.clone())
            .unwrap_or_else(|| csv.to_path_buf())
    }
}

/// What a run writes and counts as it goes.
pub(super) struct Out {
    pub(super) summary: Summary,
    pub(super) progress: Progress,
    pub(super) sinks: HashMap<PathBuf, CsvSink>,
    pub(super) written: HashMap<PathBuf, u64>,
    /// Each row also goes to stdout as a JSON line.
    pub(super) machine: bool,
    /// A limited point's child: rows go to the parent on stdout, never to a CSV.
    pub(super) to_parent: bool,
}

impl Out {
    /// Writes one row to its CSV, and to stdout when the run is machine-read (a limited point's
    /// child sends it to its parent instead).
    pub(super) fn emit(&mut self, csv: &Path, row: &Row) -> anyhow::Result<()> {
        if self.to_parent {
            return super::wire::send(&super::wire::Report::Row(Box::new(row.clone())));
        }
        append_row(&mut self.sinks, &mut self.written, csv, row)?;
        if self.machine {
            machine::emit(row)?;
        }
        Ok(())
    }
}

/// Appends `row` to `csv` (opening the sink on first use) and counts it.
pub(super) fn append_row(
    sinks: &mut HashMap<PathBuf, CsvSink>,
    written: &mut HashMap<PathBuf, u64>,
    csv: &Path,
    row: &Row,
) -> anyhow::Result<()> {
    if !sinks.contains_key(csv) {
        sinks.insert(csv.to_path_buf(), CsvSink::open(csv)?);
    }
    if let Some(s) = sinks.get_mut(csv) {
        s.append(row)?;
    }
    *written.entry(csv.to_path_buf()).or_default() += 1;
    Ok(())
}
