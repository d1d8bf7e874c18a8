//! `--machine`: one JSON object per row on stdout (JSON Lines), flushed as the row lands. The keys
//! are the CSV's column names because the object is the same `Row`, serialized by serde: the names
//! live in one place. Empty cells are `null`.
use std::io::Write;

use anyhow::Context;

use crate::sink::row::Row;

/// The line for one row (without the newline).
pub fn line(r: &Row) -> anyhow::Result<String> {
    serde_json::to_string(r).context("writing a row as JSON")
}

/// Prints the line and flushes, so a reader sees each row as it lands. A closed stdout (the reader
/// went away) is an error: the run stops instead of computing rows nobody reads.
pub fn emit(r: &Row) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", line(r)?).context("writing a --machine line to stdout")?;
    out.flush().context("writing a --machine line to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_csv_columns() {
        let v: serde_json::Value = serde_json::from_str(&line(&Row::default()).unwrap()).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        let cols = Row::columns();
        assert_eq!(keys.len(), cols.len());
        for c in &cols {
            assert!(v.get(c).is_some(), "{c}");
        }
    }
}
