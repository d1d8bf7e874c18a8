//! The append-only CSV sink: header written once, each row one `write` then flush and fsync, a
//! different header refused, a torn last line (a kill mid-write) detected and cut before appending.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::row::Row;

/// What can go wrong with the CSV file.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The file was written by a build with other columns; rows are never mixed.
    #[error("{path}: its header differs from this build's ({detail}); write to a new CSV (change `csv` in the job) or move the old file away")]
    HeaderMismatch {
        /// The file.
        path: String,
        /// The first difference.
        detail: String,
    },
    /// A complete row that does not parse (edited by hand?).
    #[error("{path}:{line}: row does not parse: {reason}")]
    BadRow {
        /// The file.
        path: String,
        /// 1-based line.
        line: u64,
        /// Why.
        reason: String,
    },
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

/// An existing CSV as found: its complete rows and the size of a torn tail, if any.
#[derive(Debug, Default)]
pub struct Existing {
    /// Complete rows, in file order.
    pub rows: Vec<Row>,
    /// Bytes after the last newline (a row cut by a kill); 0 when the file ends cleanly.
    pub torn_bytes: u64,
    /// Length of the complete part.
    pub good_len: u64,
}

/// Reads `path` without changing it: header check, complete rows, torn tail.
pub fn inspect(path: &Path) -> Result<Existing, SinkError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::default()),
        Err(e) => return Err(io(path)(e)),
    };
    let good_len = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let torn_bytes = (bytes.len() - good_len) as u64;
    let good = &bytes[..good_len];
    let header = Row::header_line();
    if good.is_empty() {
        // Only a torn header (or nothing): it must be a prefix of ours to be cut safely.
        if !header.as_bytes().starts_with(&bytes) {
            return Err(SinkError::HeaderMismatch {
                path: path.display().to_string(),
                detail: "its first line is not a bmoe header".into(),
            });
        }
        return Ok(Existing {
            rows: Vec::new(),
            torn_bytes,
            good_len: 0,
        });
    }
    let first_nl = good.iter().position(|&b| b == b'\n').unwrap_or(good.len());
    let found = String::from_utf8_lossy(&good[..first_nl])
        .trim_end_matches('\r')
        .to_string();
    let want = Row::columns();
    if found != want.join(",") {
        let have: Vec<&str> = found.split(',').collect();
        let detail = match (0..want.len().max(have.len()))
            .find(|&i| have.get(i).copied() != want.get(i).map(|s| s.as_str()))
        {
            Some(i) => format!(
                "column {} is {} in the file, {} in this build",
                i + 1,
                have.get(i)
                    .map(|s| format!("`{s}`"))
                    .unwrap_or_else(|| "missing".into()),
                want.get(i)
                    .map(|s| format!("`{s}`"))
                    .unwrap_or_else(|| "absent".into())
            ),
            None => "the header line differs".into(),
        };
        return Err(SinkError::HeaderMismatch {
            path: path.display().to_string(),
            detail,
        });
    }
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(good);
    let mut rows = Vec::new();
    for r in rdr.deserialize::<Row>() {
        match r {
            Ok(row) => rows.push(row),
            Err(e) => {
                return Err(SinkError::BadRow {
                    path: path.display().to_string(),
                    line: e.position().map(|p| p.line()).unwrap_or(0),
                    reason: e.to_string(),
                })
            }
        }
    }
    Ok(Existing {
        rows,
        torn_bytes,
        good_len: good_len as u64,
    })
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

    #[test]
    fn other_header_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.csv");
        std::fs::write(&p, "a,b,c\n1,2,3\n").unwrap();
        let e = CsvSink::open(&p).err().unwrap();
        assert!(
            e.to_string()
                .contains("column 1 is `a` in the file, `run_id` in this build"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a,b,c\n1,2,3\n");
    }
}
