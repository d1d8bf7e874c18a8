//! The report's rows, read through the shared reader (`sink::read`) by column name: any header
//! that has the identity columns is accepted, metric columns it lacks are simply absent, and
//! files with different headers (older or newer builds, other schema versions) are read side by
//! side. The report's policy: a ragged or torn row is left out and counted.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::error::ReportError;
use crate::config::declare::settings_values;
use crate::sink::key::RowKey;
use crate::sink::read::{self, ReadError};
use crate::sink::row::{RECORDED_SETTINGS, SETTINGS_COLUMN};

/// Columns whose values must agree for rows to be pooled in one group: the settings as resolved
/// and as configured (`settings.<key>`, read from the `settings` cell; not the per-item outcomes such as `prefill_device` or `reuse`), the machine, the build and
/// the model. Rows of one point that differ in any of them are split into separate groups.
pub static SPLIT: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    RECORDED_SETTINGS
        .iter()
        .map(String::as_str)
        .chain(["host", "git_commit", "model_sha256"])
        .collect()
});

/// Text columns the provenance header summarises (besides `run_id`).
pub const PROVENANCE: &[&str] = &[
    "host",
    "cpu_model",
    "cpu_cores",
    "git_commit",
    "model",
    "model_sha256",
    "time",
];

/// All rows of all inputs, with one column registry shared by every file.
#[derive(Debug, Default)]
pub struct Data {
    /// The inputs, in command-line order.
    pub files: Vec<FileInfo>,
    /// Every column name seen in any file, in first-seen order.
    pub columns: Vec<String>,
    /// Column name -> index into [`Data::columns`].
    pub index: HashMap<String, usize>,
    /// The rows.
    pub recs: Vec<Rec>,
    /// Keys already read, to count a duplicated row once.
    seen: HashSet<RowKey>,
}

/// One input file as read.
#[derive(Debug, Clone)]
pub struct FileInfo {
    /// The path as given.
    pub path: PathBuf,
    /// Its header.
    pub columns: Vec<String>,
    /// Data rows read.
    pub rows: usize,
    /// Rows skipped because their field count differs from the header (a torn last row).
    pub skipped: usize,
    /// Distinct `schema_version` values, when the file has that column.
    pub schema_versions: Vec<String>,
    /// Rows left out because an earlier row (in this or an earlier file) has the same key.
    pub duplicates: Duplicates,
}

/// One row, reduced to what the report uses.
#[derive(Debug, Clone)]
pub struct Rec {
    /// `run_id` (empty when the column is absent).
    pub run_id: String,
    /// `job`.
    pub job: String,
    /// `profile`.
    pub profile: String,
    /// `point`.
    pub point: String,
    /// `item`.
    pub item: String,
    /// `repeat`, when the file has the column.
    pub repeat: Option<u32>,
    /// `best`, when present and non-empty.
    pub best: Option<i64>,
    /// Whether the decision was right: the `correct` column, else `best == expected`.
    pub correct: Option<bool>,
    /// `moe_stream`, when the file has it (expert reads exist only with streaming).
    pub moe_stream: Option<bool>,
    /// Whether stock llama.cpp ran the row (`runtime` = `llama.cpp`): the baseline.
    pub stock: bool,
    /// The engine refused the item (`error` non-empty).
    pub failed: bool,
    /// Every cell that parses as a number, by index into [`Data::columns`].
    pub nums: Vec<Option<f64>>,
    /// The [`SPLIT`] cells, in that order (empty where the file lacks the column).
    pub split: Vec<String>,
    /// The [`PROVENANCE`] cells, in that order (empty where the file lacks the column).
    pub prov: Vec<String>,
}

impl Rec {
    /// The row's identity (a file without the `repeat` column wrote repeat 0 only).
    pub fn key(&self) -> RowKey {
        RowKey {
            run_id: self.run_id.clone(),
            job: self.job.clone(),
            profile: self.profile.clone(),
            point: self.point.clone(),
            item: self.item.clone(),
            repeat: self.repeat.unwrap_or(0),
        }
    }
}

/// Rows that repeat an earlier row's (run, job, profile, point, item, repeat): counted once.
#[derive(Debug, Clone, Default)]
pub struct Duplicates {
    /// Rows dropped.
    pub rows: usize,
    /// The first repeated key, for the message.
    pub example: Option<String>,
}

impl Data {
    /// The numeric value of `col` in `r`, if the file had the column and the cell is a number.
    pub fn num(&self, r: &Rec, col: &str) -> Option<f64> {
        let i = *self.index.get(col)?;
        r.nums.get(i).copied().flatten()
    }

    /// Whether any input has `col`.
    pub fn has(&self, col: &str) -> bool {
        self.index.contains_key(col)
    }

    /// The inputs that lack `col`, as displayed paths.
    pub fn files_without(&self, col: &str) -> Vec<String> {
        self.files
            .iter()
            .filter(|f| !f.columns.iter().any(|c| c == col))
            .map(|f| f.path.display().to_string())
            .collect()
    }

    fn col(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        self.columns.push(name.to_string());
        self.index.insert(name.to_string(), self.columns.len() - 1);
        self.columns.len() - 1
    }

    /// Reads one file through the shared reader (`sink::read`) and adds its rows; a cell of a
    /// numeric column that is not a number refuses the whole file (its numbers cannot be
    /// trusted), as `compare` and `merge` do.
    pub fn add_file(&mut self, path: &Path) -> Result<(), ReportError> {
        let table = read::read(path).map_err(from_read)?;
        if table.blank {
            return Err(ReportError::Empty {
                path: path.display().to_string(),
            });
        }
        let header = if table.header.is_empty() {
            // One line without its newline: a header written by hand, no rows.
            read::header_of(path, &table.tail).map_err(from_read)?
        } else {
            table.header.clone()
        };
        let cols: Vec<usize> = header.iter().map(|h| self.col(h)).collect();
        let mut info = FileInfo {
            path: path.to_path_buf(),
            columns: header.clone(),
            rows: 0,
            skipped: 0,
            schema_versions: Vec::new(),
            duplicates: Duplicates::default(),
        };
        let at = Positions::of(&header);
        let tail = table.tail_record();
        let mut recs = Vec::new();
        for rec in table.records.iter().chain(tail.iter()) {
            // A row with another cell count is a torn last write or a hand edit: it cannot be
            // matched to the header, so it is left out (and counted in the report).
            if rec.cells.len() != header.len() {
                info.skipped += 1;
                continue;
            }
            let mut nums = vec![None; self.columns.len()];
            for (&c, v) in cols.iter().zip(table.numbers(rec).map_err(from_read)?) {
                nums[c] = v;
            }
            let ver = at.cell(&rec.cells, at.version);
            if !ver.is_empty() && !info.schema_versions.iter().any(|v| v == ver) {
                info.schema_versions.push(ver.to_string());
            }
            info.rows += 1;
            recs.push((rec.line, at.rec(&rec.cells, nums)));
        }
        // A failed row that `run --retry-errors` ran again gives way to its retry.
        let gone = read::superseded(recs.iter().map(|(_, r)| (r.key(), r.failed)));
        let kept: Vec<(u64, Rec)> = recs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, lr)| lr)
            .collect();
        for (line, r) in kept {
            self.keep_unless_duplicate(r, line, &mut info.duplicates);
        }
        self.files.push(info);
        Ok(())
    }

    /// Keeps `r` unless an earlier row (in this or an earlier file) has its key; a duplicate is
    /// counted once, the first one kept as the message's example.
    fn keep_unless_duplicate(&mut self, r: Rec, line: u64, dup: &mut Duplicates) {
        let key = r.key();
        // Without a run id two rows cannot be told to be the same run's: both count.
        if !r.run_id.is_empty() && !self.seen.insert(key.clone()) {
            dup.rows += 1;
            dup.example
                .get_or_insert_with(|| format!("line {line}: {key}"));
            return;
        }
        self.recs.push(r);
    }
}

/// The shared reader's error in the report's words (a bad file is left out, so it says so).
fn from_read(e: ReadError) -> ReportError {
    match e {
        ReadError::Io { path, cause } => ReportError::Io { path, cause },
        ReadError::NotTelemetry { path, detail } => ReportError::NotTelemetry { path, detail },
        ReadError::BadRow { path, line, reason } => ReportError::BadRow { path, line, reason },
        ReadError::BadCell {
            path,
            line,
            column,
            value,
            ..
        } => ReportError::BadCell {
            path,
            line,
            column,
            value,
        },
    }
}

/// Where the columns the report reads by name sit in one file's header.
struct Positions {
    job: Option<usize>,
    profile: Option<usize>,
    point: Option<usize>,
    item: Option<usize>,
    run: Option<usize>,
    repeat: Option<usize>,
    best: Option<usize>,
    correct: Option<usize>,
    expected: Option<usize>,
    error: Option<usize>,
    version: Option<usize>,
    stream: Option<usize>,
    runtime: Option<usize>,
    split: Vec<Option<usize>>,
    prov: Vec<Option<usize>>,
}

impl Positions {
    fn of(header: &[String]) -> Positions {
        let at = |name: &str| header.iter().position(|h| h == name);
        Positions {
            job: at("job"),
            profile: at("profile"),
            point: at("point"),
            item: at("item"),
            run: at("run_id"),
            repeat: at("repeat"),
            best: at("best"),
            correct: at("correct"),
            expected: at("expected"),
            error: at("error"),
            version: at("schema_version"),
            stream: at("moe_stream"),
            runtime: at("runtime"),
            // A configured value's position is the `settings` cell's; `rec` reads the key in it.
            split: SPLIT
                .iter()
                .map(|c| at(configured(c).map_or(c, |_| SETTINGS_COLUMN)))
                .collect(),
            prov: PROVENANCE.iter().map(|c| at(c)).collect(),
        }
    }

    fn cell<'a>(&self, rec: &'a csv::StringRecord, i: Option<usize>) -> &'a str {
        i.and_then(|i| rec.get(i)).unwrap_or("").trim()
    }

    fn flag(&self, rec: &csv::StringRecord, i: Option<usize>) -> Option<bool> {
        match self.cell(rec, i) {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        }
    }

    /// The [`SPLIT`] cells of a record: a `settings.<key>` one is that key's value in the
    /// `settings` cell (parsed once per record).
    fn split_cells(&self, rec: &csv::StringRecord) -> Vec<String> {
        let mut values = None;
        SPLIT
            .iter()
            .zip(&self.split)
            .map(|(name, &i)| match configured(name) {
                Some(key) => {
                    let m = values.get_or_insert_with(|| settings_values(self.cell(rec, i)));
                    m.get(key).cloned().unwrap_or_default()
                }
                None => self.cell(rec, i).to_string(),
            })
            .collect()
    }

    fn rec(&self, rec: &csv::StringRecord, nums: Vec<Option<f64>>) -> Rec {
        let best = self.cell(rec, self.best).parse::<i64>().ok();
        let correct = self.flag(rec, self.correct).or_else(|| {
            match (best, self.cell(rec, self.expected).parse::<i64>().ok()) {
                (Some(b), Some(e)) => Some(b == e),
                _ => None,
            }
        });
        let texts = |cols: &[Option<usize>]| {
            cols.iter()
                .map(|&i| self.cell(rec, i).to_string())
                .collect()
        };
        Rec {
            run_id: self.cell(rec, self.run).to_string(),
            job: self.cell(rec, self.job).to_string(),
            profile: self.cell(rec, self.profile).to_string(),
            point: self.cell(rec, self.point).to_string(),
            item: self.cell(rec, self.item).to_string(),
            repeat: self.cell(rec, self.repeat).parse().ok(),
            best,
            correct,
            moe_stream: self.flag(rec, self.stream),
            stock: self.cell(rec, self.runtime) == "llama.cpp",
            failed: !self.cell(rec, self.error).is_empty(),
            nums,
            split: self.split_cells(rec),
            prov: texts(&self.prov),
        }
    }
}

/// The layered key of a `settings.<key>` name.
fn configured(name: &str) -> Option<&str> {
    name.strip_prefix(SETTINGS_COLUMN)?.strip_prefix('.')
}

/// A sweep point label (`cache_mb=1500,threads=4`, or `base`) as (key, value) pairs.
pub fn point_params(label: &str) -> Vec<(String, String)> {
    if label == "base" {
        return Vec::new();
    }
    label
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_by_name_across_headers() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            d.path(),
            "a.csv",
            "job,profile,point,item,prefill_tps\nj,p,base,1,10\n",
        );
        let b = write(
            d.path(),
            "b.csv",
            "prefill_tps,item,point,profile,job,peak_rss_mib,schema_version\n20,1,base,p,j,300,2\n",
        );
        let mut data = Data::default();
        data.add_file(&a).unwrap();
        data.add_file(&b).unwrap();
        assert_eq!(data.recs.len(), 2);
        assert_eq!(data.num(&data.recs[0], "prefill_tps"), Some(10.0));
        assert_eq!(data.num(&data.recs[1], "prefill_tps"), Some(20.0));
        assert_eq!(data.num(&data.recs[0], "peak_rss_mib"), None);
        assert_eq!(data.num(&data.recs[1], "peak_rss_mib"), Some(300.0));
        assert_eq!(data.files_without("peak_rss_mib").len(), 1);
        assert_eq!(data.files[1].schema_versions, vec!["2".to_string()]);
    }

    #[test]
    fn refuses_empty_and_foreign_files() {
        let d = tempfile::tempdir().unwrap();
        let e = write(d.path(), "e.csv", "");
        let f = write(d.path(), "f.csv", "name,value\nx,1\n");
        let mut data = Data::default();
        assert!(matches!(data.add_file(&e), Err(ReportError::Empty { .. })));
        let err = data.add_file(&f).unwrap_err().to_string();
        assert!(err.contains("no column job, profile, point, item"), "{err}");
    }

    #[test]
    fn point_labels_split() {
        assert!(point_params("base").is_empty());
        assert_eq!(
            point_params("cache_mb=1,threads=4"),
            vec![
                ("cache_mb".to_string(), "1".to_string()),
                ("threads".to_string(), "4".to_string())
            ]
        );
    }
}
