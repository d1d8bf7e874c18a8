//! `--machine`: one JSON object per row on stdout (JSON Lines), flushed as the row lands. The keys
//! are the CSV's column names because the object is the same `Row`, serialized by serde: the names
//! live in one place. An empty cell is `null`, whatever its column's type (an empty string, list
//! or option alike), as `schemas/telemetry.schema.json` says.
use std::io::Write;

use anyhow::Context;

use crate::sink::row::Row;

/// The line for one row (without the newline).
pub fn line(r: &Row) -> anyhow::Result<String> {
    let mut v = serde_json::to_value(r).context("writing a row as JSON")?;
    if let Some(m) = v.as_object_mut() {
        for cell in m.values_mut() {
            if cell.as_str() == Some("") {
                *cell = serde_json::Value::Null;
            }
        }
    }
    serde_json::to_string(&v).context("writing a row as JSON")
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

    /// An empty cell is null whatever the column's type: no "" for a string, a list or an
    /// option; a filled cell keeps its JSON type.
    #[test]
    fn empty_cells_are_null() {
        let r = Row {
            run_id: "r".into(),
            ppl: Some(2.5),
            ..Row::default()
        };
        let v: serde_json::Value = serde_json::from_str(&line(&r).unwrap()).unwrap();
        for c in [
            "shard",
            "expected",
            "choice_logp",
            "error",
            "text",
            "best",
            "nll_mean",
        ] {
            assert!(v[c].is_null(), "{c}: {}", v[c]);
        }
        assert_eq!(v["run_id"], "r");
        assert_eq!(v["ppl"], 2.5);
        assert_eq!(v["cancelled"], false);
        assert_eq!(v["tokens"], 0);
    }
}
