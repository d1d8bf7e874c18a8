//! The append-only CSV sink: header written once, each row one `write` then flush and fsync, a torn
//! last line (a kill mid-write) detected and cut before appending. Files are read by column name
//! through the shared reader (`sink::read`):
//! an older build's file (its header a prefix of ours) stays readable, and appending to it starts
//! a new file next to it (`<stem>.v<schema>.csv`) rather than mixing two headers in one file.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::read::{self, ReadError, IDENTITY};
use super::row::{Row, SCHEMA_VERSION};

/// What can go wrong with the CSV file.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Not a bmoe telemetry file, or one this build cannot append to.
    #[error("{path}: {detail}")]
    HeaderMismatch {
        /// The file.
        path: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// The file does not read as a bmoe telemetry CSV (foreign header, bad row or cell).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Filesystem trouble.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> SinkError + '_ {
    move |source| SinkError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// How a file's header relates to this build's columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderKind {
    /// Exactly this build's columns.
    Current,
    /// A strict prefix of them: an older build (columns are only appended).
    Older,
    /// This build's columns and more: a newer build.
    Newer,
    /// Has the key columns but in another arrangement (edited, or exported by a tool): readable
    /// by name, never appended to.
    Other,
}

/// Classifies a header against this build's columns; `None` when it lacks a key column.
pub fn classify(header: &[String]) -> Option<HeaderKind> {
    let ours = Row::columns();
    if header == ours.as_slice() {
        return Some(HeaderKind::Current);
    }
    if header.len() < ours.len() && ours.starts_with(header) {
        return Some(HeaderKind::Older);
    }
    if header.len() > ours.len() && header.starts_with(&ours) {
        return Some(HeaderKind::Newer);
    }
    IDENTITY
        .iter()
        .all(|k| header.iter().any(|h| h == k))
        .then_some(HeaderKind::Other)
}

/// An existing CSV as found: its header, complete rows and the size of a torn tail, if any.
#[derive(Debug, Default)]
pub struct Existing {
    /// The header's column names; empty when the file is absent or holds no complete line.
    pub header: Vec<String>,
    /// How the header relates to this build's; `None` when there is no header yet.
    pub kind: Option<HeaderKind>,
    /// Complete rows, in file order, read by column name (missing columns at their defaults).
    pub rows: Vec<Row>,
    /// Bytes after the last newline (a row cut by a kill); 0 when the file ends cleanly.
    pub torn_bytes: u64,
    /// Length of the complete part.
    pub good_len: u64,
}

impl Existing {
    /// The schema version that wrote the file: the largest `schema_version` of its rows, else 1
    /// (the column appeared in version 2); `None` without a header.
    pub fn schema_version(&self) -> Option<u32> {
        if self.header.is_empty() {
            return None;
        }
        if !self.header.iter().any(|h| h == "schema_version") {
            return Some(1);
        }
        Some(
            self.rows
                .iter()
                .filter_map(|r| r.schema_version)
                .max()
                .unwrap_or(SCHEMA_VERSION),
        )
    }
}

/// Reads `path` without changing it, through the shared reader: header, complete rows (by
/// column name), torn tail. An absent file is empty; a file without the identity columns, a
/// ragged row or a bad cell is refused.
pub fn inspect(path: &Path) -> Result<Existing, SinkError> {
    let table = match read::read(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(Existing::default()),
        Err(e) => return Err(e.into()),
    };
    let torn_bytes = table.torn_bytes();
    if table.header.is_empty() {
        // Only a torn header (or nothing): it must be a prefix of ours to be cut safely.
        if table.good_len > 0 || !Row::header_line().as_bytes().starts_with(&table.tail) {
            return Err(SinkError::HeaderMismatch {
                path: path.display().to_string(),
                detail: "its first line is not a bmoe header".into(),
            });
        }
        return Ok(Existing {
            torn_bytes,
            ..Existing::default()
        });
    }
    let rows = table.rows()?;
    Ok(Existing {
        kind: classify(&table.header),
        header: table.header,
        rows,
        torn_bytes,
        good_len: table.good_len,
    })
}

/// Where the rows for a job's CSV go, and which files hold its earlier rows.
#[derive(Debug, Clone)]
pub struct Target {
    /// The file rows are appended to: the job's CSV, or the new file next to an older one.
    pub write: PathBuf,
    /// Said once on stderr when the rows go to a new file next to an older one.
    pub note: Option<String>,
}

/// The file next to `path` for this build's schema: `runs/x.csv` -> `runs/x.v2.csv`.
pub fn versioned(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.v{SCHEMA_VERSION}.csv"))
}

/// Decides where rows for `path` go without writing anything: the file itself when it is new or
/// has this build's header; the versioned file next to it when it was written by an older build
/// (or holds the columns in another order); a refusal for a newer build's file.
pub fn resolve(path: &Path) -> Result<(Target, Vec<Row>), SinkError> {
    let e = inspect(path)?;
    match e.kind {
        None | Some(HeaderKind::Current) => Ok((
            Target {
                write: path.to_path_buf(),
                note: None,
            },
            e.rows,
        )),
        Some(HeaderKind::Newer) => {
            let extra = &e.header[Row::columns().len()..];
            Err(SinkError::HeaderMismatch {
                path: path.display().to_string(),
                detail: format!(
                    "written by a newer bmoe (columns this build does not know: {}); run that build, or give another CSV with --csv",
                    extra.join(", ")
                ),
            })
        }
        Some(k @ (HeaderKind::Older | HeaderKind::Other)) => {
            let next = versioned(path);
            let n = inspect(&next)?;
            if !matches!(n.kind, None | Some(HeaderKind::Current)) {
                return Err(SinkError::HeaderMismatch {
                    path: next.display().to_string(),
                    detail: format!(
                        "{} has another header, and so does this file: move one away",
                        path.display()
                    ),
                });
            }
            let why = match k {
                HeaderKind::Older => format!(
                    "was written by an older bmoe (schema {})",
                    e.schema_version().unwrap_or(1)
                ),
                _ => "holds the columns in another order".to_string(),
            };
            let note = format!(
                "bmoe: {} {why}; this build writes schema {SCHEMA_VERSION}: appending to {} instead",
                crate::config::paths::display_path(path),
                crate::config::paths::display_path(&next)
            );
            let mut rows = e.rows;
            rows.extend(n.rows);
            Ok((
                Target {
                    write: next,
                    note: Some(note),
                },
                rows,
            ))
        }
    }
}

/// An open CSV, positioned at its end, ready for whole rows.
pub struct CsvSink {
    path: PathBuf,
    file: File,
}

impl CsvSink {
    /// Opens (creating folders and the file as needed) for appending: cuts a torn last line,
    /// saying so on stderr, and writes the header when the file is new.
    pub fn open(path: &Path) -> Result<Self, SinkError> {
        let existing = inspect(path)?;
        if !matches!(existing.kind, None | Some(HeaderKind::Current)) {
            // resolve() sends rows elsewhere in this case; reaching here is a caller's mistake,
            // refused rather than mixing two headers in one file.
            return Err(SinkError::HeaderMismatch {
                path: path.display().to_string(),
                detail: "its header differs from this build's; rows are never mixed".into(),
            });
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(io(path))?;
        if existing.torn_bytes > 0 {
            file.set_len(existing.good_len).map_err(io(path))?;
            file.sync_all().map_err(io(path))?;
            eprintln!(
                "bmoe: {}: the last row was torn (an interrupted write, {} bytes without a newline); removed it",
                path.display(),
                existing.torn_bytes
            );
        }
        let mut sink = Self {
            path: path.to_path_buf(),
            file,
        };
        if existing.good_len == 0 {
            sink.write_line(Row::header_line().as_bytes())?;
        }
        Ok(sink)
    }

    /// Appends one row: a single write of the whole line, then flush and fsync, so a kill can
    /// tear at most this row.
    pub fn append(&mut self, row: &Row) -> Result<(), SinkError> {
        let line = row
            .to_line()
            .map_err(|e| io(&self.path)(std::io::Error::other(e.to_string())))?;
        self.write_line(&line)
    }

    fn write_line(&mut self, line: &[u8]) -> Result<(), SinkError> {
        self.file.write_all(line).map_err(io(&self.path))?;
        self.file.flush().map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(item: &str) -> Row {
        Row {
            run_id: "r".into(),
            item: item.into(),
            ..Row::default()
        }
    }

    /// A file an older build wrote (schema 2's columns end at `reuse_reason`, schema 3's at
    /// `prefill_dev_whole_fallback`) is an older header: this build appends next to it, in
    /// `<stem>.v<SCHEMA_VERSION>.csv`.
    #[test]
    fn schema_2_and_3_files_rotate_to_the_current_version() {
        let cols = Row::columns();
        for last in ["reuse_reason", "prefill_dev_whole_fallback"] {
            let end = cols.iter().position(|c| c == last).unwrap() + 1;
            assert!(
                end < cols.len(),
                "later schemas appended columns after {last}"
            );
            assert_eq!(classify(&cols[..end]), Some(HeaderKind::Older));
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("nightly.csv");
            std::fs::write(&p, format!("{}\n", cols[..end].join(","))).unwrap();
            let (t, _) = resolve(&p).unwrap();
            assert_eq!(
                t.write,
                d.path().join(format!("nightly.v{SCHEMA_VERSION}.csv"))
            );
        }
    }

    #[test]
    fn header_once_rows_appended() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/x.csv");
        let mut s = CsvSink::open(&p).unwrap();
        s.append(&row("a")).unwrap();
        drop(s);
        let mut s = CsvSink::open(&p).unwrap();
        s.append(&row("b")).unwrap();
        let e = inspect(&p).unwrap();
        assert_eq!(e.rows.len(), 2);
        assert_eq!(e.rows[1].item, "b");
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.matches("run_id,").count(), 1);
    }

    #[test]
    fn torn_row_is_cut() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.csv");
        let mut s = CsvSink::open(&p).unwrap();
        s.append(&row("a")).unwrap();
        drop(s);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"r,2026,job,dec").unwrap();
        assert_eq!(inspect(&p).unwrap().torn_bytes, 14);
        let mut s = CsvSink::open(&p).unwrap();
        s.append(&row("b")).unwrap();
        let e = inspect(&p).unwrap();
        assert_eq!(e.torn_bytes, 0);
        assert_eq!(
            e.rows.iter().map(|r| r.item.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    /// A bad cell names its 1-based file line, column and value; a short row its cell count.
    #[test]
    fn bad_cells_and_short_rows_are_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.csv");
        let good = String::from_utf8(row("a").to_line().unwrap()).unwrap();
        let bad = good.replacen(",false,", ",maybe,", 1);
        std::fs::write(&p, format!("{}{good}{bad}", Row::header_line())).unwrap();
        let e = inspect(&p).unwrap_err().to_string();
        assert!(
            e.ends_with("x.csv line 3, column moe_stream: \"maybe\" is not true or false"),
            "{e}"
        );
        std::fs::write(&p, format!("{}{good}{good}r,t,j\n", Row::header_line())).unwrap();
        let e = inspect(&p).unwrap_err().to_string();
        let n = Row::columns().len();
        assert!(
            e.ends_with(&format!(
                "x.csv line 4: 3 cells, but the header has {n} columns"
            )),
            "{e}"
        );
    }

    #[test]
    fn foreign_header_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.csv");
        std::fs::write(&p, "a,b,c\n1,2,3\n").unwrap();
        let e = CsvSink::open(&p).err().unwrap();
        assert!(
            e.to_string()
                .contains("not a bmoe telemetry CSV: no column job, profile, point, item"),
            "{e}"
        );
        assert!(resolve(&p).is_err());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a,b,c\n1,2,3\n");
    }

    #[test]
    fn older_header_reads_by_name_and_rotates() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.csv");
        let cols = Row::columns();
        let old = &cols[..cols.iter().position(|c| c == "schema_version").unwrap()];
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(old).unwrap();
        // Each column at its default as this build writes it (numbers 0, flags false, the
        // rest empty), then the few that matter here.
        let default_line = String::from_utf8(Row::default().to_line().unwrap()).unwrap();
        let defaults: Vec<String> = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(default_line.as_bytes())
            .records()
            .next()
            .unwrap()
            .unwrap()
            .iter()
            .map(str::to_string)
            .collect();
        let mut rec: Vec<String> = defaults[..old.len()].to_vec();
        for (i, c) in old.iter().enumerate() {
            match c.as_str() {
                "run_id" => rec[i] = "r".into(),
                "item" => rec[i] = "a".into(),
                "cache_hit_pct" => rec[i] = "-1".into(),
                _ => {}
            }
        }
        w.write_record(&rec).unwrap();
        let text = w.into_inner().unwrap();
        std::fs::write(&p, &text).unwrap();
        let e = inspect(&p).unwrap();
        assert_eq!(e.kind, Some(HeaderKind::Older));
        assert_eq!(e.schema_version(), Some(1));
        assert_eq!(e.rows[0].item, "a");
        assert_eq!(e.rows[0].host, "");
        let (t, rows) = resolve(&p).unwrap();
        assert_eq!(t.write, d.path().join(format!("x.v{SCHEMA_VERSION}.csv")));
        assert!(t.note.unwrap().contains("older bmoe (schema 1)"));
        assert_eq!(rows.len(), 1);
        let mut s = CsvSink::open(&t.write).unwrap();
        s.append(&row("b")).unwrap();
        assert_eq!(
            std::fs::read(&p).unwrap(),
            text,
            "the older file is untouched"
        );
        assert!(CsvSink::open(&p).is_err(), "never appended to directly");
    }
}
