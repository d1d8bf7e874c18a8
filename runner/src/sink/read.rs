//! The one reader of bmoe telemetry CSVs, used by `run --resume`, `compare`, `merge` and
//! `report`: columns by name (any order, older and newer schemas), the complete lines apart from
//! a torn last one, each record with its 1-based file line, and one error type naming the file,
//! line, column and value. What to do with a ragged row, a torn tail or a bad file among good ones
//! is each command's policy; reading, and what counts as a bmoe CSV, is shared.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::key::RowKey;
use super::row::Row;
use crate::config::paths::display_path;

/// The columns that make a CSV a bmoe telemetry file: what identifies a row. Every schema
/// version has them; a file without one of them is another tool's.
pub const IDENTITY: &[&str] = &["job", "profile", "point", "item"];

/// What can go wrong reading a telemetry CSV.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    // The cause is shown here and not chained as a `source`, so `{:#}` prints it once.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// A CSV without the identity columns: another tool's.
    #[error("{path}: not a bmoe telemetry CSV: {detail}")]
    NotTelemetry {
        /// The file.
        path: String,
        /// What is missing, and the header found.
        detail: String,
    },
    /// A row the CSV parser refuses, or with another number of cells than the header.
    #[error("{path} line {line}: {reason}")]
    BadRow {
        /// The file.
        path: String,
        /// 1-based line of the file.
        line: u64,
        /// Why.
        reason: String,
    },
    /// A cell that does not hold its column's type (edited by hand?).
    #[error("{path} line {line}, column {column}: {value:?} {expected}")]
    BadCell {
        /// The file.
        path: String,
        /// 1-based line of the file.
        line: u64,
        /// The column's name.
        column: String,
        /// The cell as found.
        value: String,
        /// What it should be: `is not a number`.
        expected: String,
    },
}

impl ReadError {
    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound)
    }
}

/// One record of a file: its cells as written and the 1-based line it starts on.
#[derive(Debug, Clone)]
pub struct Record {
    /// 1-based line of the file.
    pub line: u64,
    /// The cells, as many as the line holds (a ragged row keeps its own count).
    pub cells: csv::StringRecord,
}

/// A telemetry CSV as read: header, complete records, and what follows the last newline.
#[derive(Debug, Default)]
pub struct Table {
    /// The file, as given.
    pub path: PathBuf,
    /// The header's column names (a byte order mark and blanks around names removed); empty
    /// when the file holds no complete line.
    pub header: Vec<String>,
    /// The complete records after the header, in file order, ragged ones included.
    pub records: Vec<Record>,
    /// The bytes after the last newline: a row cut by a kill, or a last line written without
    /// its newline; empty when the file ends cleanly.
    pub tail: Vec<u8>,
    /// The line `tail` starts on.
    pub tail_line: u64,
    /// Length of the complete part, in bytes.
    pub good_len: u64,
    /// Whether the file holds only blanks (or nothing).
    pub blank: bool,
}

/// Reads `path`: the header checked for the identity columns, the complete records by line. A
/// file without a complete line has an empty header and its bytes in `tail`.
pub fn read(path: &Path) -> Result<Table, ReadError> {
    let bytes = std::fs::read(path).map_err(|cause| ReadError::Io {
        path: display_path(path),
        cause,
    })?;
    parse(path, &bytes)
}

/// [`read`] on bytes already in memory.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Table, ReadError> {
    let good_len = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let (good, tail) = bytes.split_at(good_len);
    let mut table = Table {
        path: path.to_path_buf(),
        tail: tail.to_vec(),
        good_len: good_len as u64,
        blank: bytes.iter().all(|b| b.is_ascii_whitespace()),
        ..Table::default()
    };
    if good.is_empty() || table.blank {
        return Ok(table);
    }
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(good);
    table.header = header(path, &mut rdr)?;
    let mut lines = LineOf::new(good);
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = lines.at(e.position().map(|p| p.byte()).unwrap_or(0));
            ReadError::BadRow {
                path: display_path(path),
                line,
                reason: e.to_string(),
            }
        })?;
        let line = lines.at(rec.position().map(|p| p.byte()).unwrap_or(0));
        table.records.push(Record { line, cells: rec });
    }
    table.tail_line = lines.at(good_len as u64);
    Ok(table)
}

/// The header of a file, checked for the identity columns.
fn header(path: &Path, rdr: &mut csv::Reader<&[u8]>) -> Result<Vec<String>, ReadError> {
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| ReadError::NotTelemetry {
            path: display_path(path),
            detail: format!("its first line is not a CSV header ({e})"),
        })?
        .iter()
        // A spreadsheet's UTF-8 byte order mark would hide the first column's name.
        .map(|c| c.trim().trim_start_matches('\u{feff}').to_string())
        .collect();
    check_identity(path, &header)?;
    Ok(header)
}

/// Refuses a header without the [`IDENTITY`] columns, naming what is missing and showing the
/// header found.
pub fn check_identity(path: &Path, header: &[String]) -> Result<(), ReadError> {
    let missing: Vec<&str> = IDENTITY
        .iter()
        .copied()
        .filter(|c| !header.iter().any(|h| h == c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut shown_header = header.iter().take(8).cloned().collect::<Vec<_>>().join(",");
    if header.len() > 8 {
        shown_header.push_str(",...");
    }
    Err(ReadError::NotTelemetry {
        path: display_path(path),
        detail: format!(
            "no column {} (expected the bmoe columns {} of docs/telemetry.md; its header is `{shown_header}`)",
            missing.join(", "),
            IDENTITY.join(", ")
        ),
    })
}

/// The first line of bytes that hold no complete line, as a header (a file written by hand
/// without its newline), checked for the identity columns.
pub fn header_of(path: &Path, bytes: &[u8]) -> Result<Vec<String>, ReadError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(bytes);
    header(path, &mut rdr)
}

/// The positions of the rows a retry superseded (`bmoe run --retry-errors`): a row that carries
/// an error and is followed by a later row of the same [`RowKey`]. `rows` yields (key, carries an error) in file order (files in input order); every
/// command that reads rows leaves these out, so a retried item counts once, with its new outcome.
pub fn superseded(rows: impl IntoIterator<Item = (RowKey, bool)>) -> HashSet<usize> {
    let rows: Vec<(RowKey, bool)> = rows.into_iter().collect();
    let mut last: HashMap<&RowKey, usize> = HashMap::new();
    for (i, (k, _)) in rows.iter().enumerate() {
        last.insert(k, i);
    }
    rows.iter()
        .enumerate()
        .filter(|(i, (k, failed))| *failed && last.get(k) != Some(i))
        .map(|(i, _)| i)
        .collect()
}

/// `rows` without those a retry superseded ([`superseded`]).
pub fn without_superseded(rows: Vec<Row>) -> Vec<Row> {
    let gone = superseded(rows.iter().map(|r| (RowKey::of(r), !r.error.is_empty())));
    rows.into_iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(i))
        .map(|(_, r)| r)
        .collect()
}

impl Table {
    /// The tail as one record, when it is not blank: a torn row (fewer cells than the header)
    /// or a complete last line written without its newline.
    pub fn tail_record(&self) -> Option<Record> {
        if self.tail.iter().all(|b| b.is_ascii_whitespace()) || self.header.is_empty() {
            return None;
        }
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(self.tail.as_slice());
        let cells = rdr.records().next()?.ok()?;
        Some(Record {
            line: self.tail_line,
            cells,
        })
    }

    /// Bytes after the last newline.
    pub fn torn_bytes(&self) -> u64 {
        self.tail.len() as u64
    }

    /// Refuses a record with another number of cells than the header.
    pub fn check_width(&self, rec: &Record) -> Result<(), ReadError> {
        if rec.cells.len() == self.header.len() {
            return Ok(());
        }
        Err(ReadError::BadRow {
            path: display_path(&self.path),
            line: rec.line,
            reason: format!(
                "{} cells, but the header has {} columns",
                rec.cells.len(),
                self.header.len()
            ),
        })
    }

    /// The complete records as typed rows, by column name (columns the file lacks at their
    /// defaults); a ragged row or a cell of the wrong type is refused, named by line.
    pub fn rows(&self) -> Result<Vec<Row>, ReadError> {
        let header = csv::StringRecord::from(self.header.clone());
        let mut rows = Vec::with_capacity(self.records.len());
        for rec in &self.records {
            self.check_width(rec)?;
            match rec.cells.deserialize::<Row>(Some(&header)) {
                Ok(row) => rows.push(row),
                Err(e) => return Err(self.bad_cell(rec, &e)),
            }
        }
        Ok(rows)
    }

    /// Every cell of `rec` that parses as a number, by header position; a cell of a column the
    /// schema types as a number that holds something else is refused.
    pub fn numbers(&self, rec: &Record) -> Result<Vec<Option<f64>>, ReadError> {
        let numeric = numeric_columns();
        let mut out = Vec::with_capacity(self.header.len());
        for (k, name) in self.header.iter().enumerate() {
            let v = rec.cells.get(k).unwrap_or("").trim();
            let parsed = v.parse::<f64>().ok();
            if parsed.is_none() && !v.is_empty() && numeric.contains(name.as_str()) {
                return Err(ReadError::BadCell {
                    path: display_path(&self.path),
                    line: rec.line,
                    column: name.clone(),
                    value: v.to_string(),
                    expected: "is not a number".into(),
                });
            }
            out.push(parsed.filter(|v| v.is_finite()));
        }
        Ok(out)
    }

    /// A typed row's parse error: the cell by column name and value.
    fn bad_cell(&self, rec: &Record, e: &csv::Error) -> ReadError {
        let path = display_path(&self.path);
        let line = rec.line;
        let csv::ErrorKind::Deserialize { err, .. } = e.kind() else {
            let reason = e.to_string();
            return ReadError::BadRow { path, line, reason };
        };
        let Some(i) = err.field().map(|f| f as usize) else {
            // A message from the column's own parser (choice_logp), which names the column.
            let reason = err.kind().to_string();
            return ReadError::BadRow { path, line, reason };
        };
        let value = rec.cells.get(i).unwrap_or_default().to_string();
        use csv::DeserializeErrorKind as K;
        let expected = match err.kind() {
            K::ParseFloat(_) => "is not a number".to_string(),
            K::ParseInt(_) => "is not a whole number (0 or more)".to_string(),
            K::ParseBool(_) => "is not true or false".to_string(),
            other => format!("does not parse: {other}"),
        };
        ReadError::BadCell {
            path,
            line,
            column: self.header.get(i).cloned().unwrap_or_else(|| "?".into()),
            value,
            expected,
        }
    }
}

/// The telemetry columns typed as numbers (integer or number) in the row schema.
fn numeric_columns() -> &'static HashSet<String> {
    static NUMERIC: std::sync::OnceLock<HashSet<String>> = std::sync::OnceLock::new();
    NUMERIC.get_or_init(|| {
        let schema = super::telemetry_schema::telemetry_schema();
        let mut out = HashSet::new();
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, v) in props {
                if super::telemetry_schema::is_numeric(v) {
                    out.insert(name.clone());
                }
            }
        }
        out
    })
}

/// 1-based line numbers of byte offsets, counted forward once (offsets come in file order).
struct LineOf<'a> {
    bytes: &'a [u8],
    pos: usize,
    line: u64,
}

impl<'a> LineOf<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            line: 1,
        }
    }

    /// The line holding byte `offset`. A record never starts with a line end: the csv reader
    /// leaves the `\n` of a CRLF-ended line to the next record's start, so line ends there are
    /// the line before's.
    fn at(&mut self, offset: u64) -> u64 {
        let mut end = (offset as usize).min(self.bytes.len());
        while matches!(self.bytes.get(end), Some(b'\r' | b'\n')) {
            end += 1;
        }
        if end < self.pos {
            return self.line;
        }
        self.line += self.bytes[self.pos..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        self.pos = end;
        self.line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<Table, ReadError> {
        parse(Path::new("x.csv"), text.as_bytes())
    }

    /// Lines are the file's, across a quoted cell with a newline; the tail is apart.
    #[test]
    fn only_a_failed_row_followed_by_its_key_is_superseded() {
        let rows = [
            ("a", true),
            ("b", false),
            ("a", false),
            ("b", false),
            ("c", true),
        ];
        let key = |item: &str| RowKey {
            item: item.into(),
            ..RowKey::default()
        };
        let gone = superseded(rows.map(|(i, f)| (key(i), f)));
        // A row without an error is never superseded (duplicates stay each command's business);
        // a failed row with no later row of its key stays.
        assert_eq!(gone, HashSet::from([0]));
    }

    #[test]
    fn records_carry_file_lines_and_tail() {
        let t = table("job,profile,point,item\nj,p,base,\"a\nb\"\nj,p,base,c\nj,p,ba").unwrap();
        let lines: Vec<u64> = t.records.iter().map(|r| r.line).collect();
        assert_eq!(lines, [2, 4]);
        assert_eq!(t.torn_bytes(), 6);
        let tail = t.tail_record().unwrap();
        assert_eq!((tail.line, tail.cells.len()), (5, 3));
        // CRLF line ends (a spreadsheet's, Python's csv module's), blank lines between.
        let t = table("job,profile,point,item\r\nj,p,base,a\r\n\r\nj,p,base,c\r\nj,p,base,d\r\n")
            .unwrap();
        let lines: Vec<u64> = t.records.iter().map(|r| r.line).collect();
        assert_eq!(lines, [2, 4, 5]);
    }

    /// A foreign file is refused naming the missing identity columns and its header; a
    /// numeric cell that is not a number is named by line, column and value.
    #[test]
    fn foreign_files_and_bad_numbers_are_named() {
        let e = table("name,score\nalice,3\n").unwrap_err().to_string();
        assert!(
            e.contains("x.csv: not a bmoe telemetry CSV: no column job, profile, point, item")
                && e.contains("`name,score`"),
            "{e}"
        );
        let t = table("\u{feff}job,profile,point,item,prefill_s\nj,p,base,1,banana\n").unwrap();
        let e = t.numbers(&t.records[0]).unwrap_err().to_string();
        assert_eq!(
            e,
            "x.csv line 2, column prefill_s: \"banana\" is not a number"
        );
    }
}
