//! Reading telemetry CSVs by column name: any header that has the identity columns is accepted,
//! metric columns it lacks are simply absent, and files with different headers (older or newer
//! builds, other schema versions) are read side by side.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::ReportError;

/// Columns a file must have to be grouped at all.
pub const REQUIRED: &[&str] = &["job", "profile", "point", "item"];

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
    /// The engine refused the item (`error` non-empty).
    pub failed: bool,
    /// Every cell that parses as a number, by index into [`Data::columns`].
    pub nums: Vec<Option<f64>>,
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

    /// Reads one file and adds its rows.
    pub fn add_file(&mut self, path: &Path) -> Result<(), ReportError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
            path: shown.clone(),
            source,
        })?;
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(ReportError::Empty { path: shown });
        }
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .from_reader(bytes.as_slice());
        let header: Vec<String> = rdr
            .headers()
            .map_err(|e| ReportError::NotTelemetry {
                path: shown.clone(),
                detail: format!("its first line is not a CSV header ({e})"),
            })?
            .iter()
            // A spreadsheet's UTF-8 byte order mark would hide the first column's name.
            .map(|c| c.trim().trim_start_matches('\u{feff}').to_string())
            .collect();
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|c| !header.iter().any(|h| h == c))
            .collect();
        if !missing.is_empty() {
            let mut shown_header = header.iter().take(8).cloned().collect::<Vec<_>>().join(",");
            if header.len() > 8 {
                shown_header.push_str(",...");
            }
            return Err(ReportError::NotTelemetry {
                path: shown,
                detail: format!(
                    "no column {} (expected the bmoe columns {}; its header is `{shown_header}`)",
                    missing.join(", "),
                    REQUIRED.join(", ")
                ),
            });
        }
        let cols: Vec<usize> = header.iter().map(|h| self.col(h)).collect();
        let at = |name: &str| header.iter().position(|h| h == name);
        let (i_job, i_prof, i_point, i_item) = (at("job"), at("profile"), at("point"), at("item"));
        let (i_run, i_rep, i_best, i_corr, i_exp, i_err, i_ver) = (
            at("run_id"),
            at("repeat"),
            at("best"),
            at("correct"),
            at("expected"),
            at("error"),
            at("schema_version"),
        );
        let i_stream = at("moe_stream");
        let mut info = FileInfo {
            path: path.to_path_buf(),
            columns: header.clone(),
            rows: 0,
            skipped: 0,
            schema_versions: Vec::new(),
        };
        for (n, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(|e| ReportError::BadRow {
                path: shown.clone(),
                line: n as u64 + 2,
                reason: e.to_string(),
            })?;
            // A row with another field count is a torn last write or a hand edit: it cannot be
            // matched to the header, so it is left out (and counted in the report).
            if rec.len() != header.len() {
                info.skipped += 1;
                continue;
            }
            let cell = |i: Option<usize>| i.and_then(|i| rec.get(i)).unwrap_or("").trim();
            let mut nums = vec![None; self.columns.len()];
            for (k, &c) in cols.iter().enumerate() {
                nums[c] = rec
                    .get(k)
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .filter(|v| v.is_finite());
            }
            let best = cell(i_best).parse::<i64>().ok();
            let correct = match cell(i_corr) {
                "true" | "1" => Some(true),
                "false" | "0" => Some(false),
                _ => match (best, cell(i_exp).parse::<i64>().ok()) {
                    (Some(b), Some(e)) => Some(b == e),
                    _ => None,
                },
            };
            let ver = cell(i_ver);
            if i_ver.is_some() && !ver.is_empty() && !info.schema_versions.iter().any(|v| v == ver)
            {
                info.schema_versions.push(ver.to_string());
            }
            self.recs.push(Rec {
                run_id: cell(i_run).to_string(),
                job: cell(i_job).to_string(),
                profile: cell(i_prof).to_string(),
                point: cell(i_point).to_string(),
                item: cell(i_item).to_string(),
                repeat: cell(i_rep).parse().ok(),
                best,
                correct,
                moe_stream: match cell(i_stream) {
                    "true" | "1" => Some(true),
                    "false" | "0" => Some(false),
                    _ => None,
                },
                failed: !cell(i_err).is_empty(),
                nums,
            });
            info.rows += 1;
        }
        self.files.push(info);
        Ok(())
    }
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
