//! JSONL item files (thousands of recorded decisions): one JSON object per line, each checked
//! against the item schema; every bad line is reported with its line and column.
use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::diag::{ConfigErrors, Diagnostic};
use super::item::{decision_item, prompt_item, DecisionSpec, Item, Kind, PromptSpec};
use super::validate;

/// At most this many bad lines are listed; the rest are counted.
const MAX_REPORTED: usize = 20;

/// What a JSONL file gave: the items of the lines that parsed, and the errors of the others
/// (a duplicate id included), so one pass shows them all.
#[derive(Debug, Default)]
pub struct JsonlItems {
    /// The items that parsed, in line order.
    pub items: Vec<Item>,
    /// Every bad line (at most [`MAX_REPORTED`], then a count).
    pub errors: Vec<Diagnostic>,
}

/// Reads the items of `path`; `Err(None)` when the file does not exist, `Err(Some)` when it
/// cannot be read.
pub fn read_items(path: &Path, kind: Kind) -> Result<JsonlItems, Option<ConfigErrors>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(None),
        Err(e) => {
            return Err(Some(
                Diagnostic::file(path, format!("cannot read: {e}")).into(),
            ))
        }
    };
    let schema = match kind {
        Kind::Decide => super::json_schema::item_schema::<DecisionSpec>(),
        _ => super::json_schema::item_schema::<PromptSpec>(),
    };
    let mut out = JsonlItems::default();
    let mut n_bad = 0usize;
    // Rows are matched across runs by id: the line each id was first seen on.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (ln, line) in text.lines().enumerate() {
        // Ids default to the line number (1-based), so they stay stable when lines are appended.
        let lineno = ln + 1;
        if line.trim().is_empty() {
            continue;
        }
        let errs = match parse_line(path, &schema, kind, lineno, line) {
            Ok(it) => match seen.get(&it.id) {
                Some(first) => vec![Diagnostic::line(
                    path,
                    lineno,
                    1,
                    "id",
                    format!(
                        "id {:?} is already used on line {first}: ids must be unique",
                        it.id
                    ),
                )],
                None => {
                    seen.insert(it.id.clone(), lineno);
                    out.items.push(it);
                    continue;
                }
            },
            Err(errs) => errs,
        };
        for d in errs {
            n_bad += 1;
            if out.errors.len() < MAX_REPORTED {
                out.errors.push(d);
            }
        }
    }
    if n_bad > out.errors.len() {
        let more = n_bad - out.errors.len();
        out.errors.push(Diagnostic::file(
            path,
            format!("... and {more} more bad lines"),
        ));
    }
    if out.items.is_empty() && out.errors.is_empty() {
        return Err(Some(
            Diagnostic::file(path, "holds no items (every line is blank)".into()).into(),
        ));
    }
    Ok(out)
}

/// One non-blank line as an item, or its errors (positioned at the line; a JSONL line can be a
/// whole prompt, so no source snippet).
fn parse_line(
    path: &Path,
    schema: &Value,
    kind: Kind,
    lineno: usize,
    line: &str,
) -> Result<Item, Vec<Diagnostic>> {
    let v: Value = serde_json::from_str(line).map_err(|e| {
        vec![Diagnostic::line(
            path,
            lineno,
            e.column(),
            "",
            format!("not valid JSON: {}", strip_position(&e.to_string())),
        )]
    })?;
    let violations = validate::validate(schema, &v);
    if !violations.is_empty() {
        return Err(violations
            .into_iter()
            .map(|vi| Diagnostic::line(path, lineno, 1, &vi.field, vi.message).with_help(vi.help))
            .collect());
    }
    let item = match kind {
        Kind::Decide => {
            serde_json::from_value::<DecisionSpec>(v).map(|d| decision_item(lineno, &d))
        }
        _ => serde_json::from_value::<PromptSpec>(v).map(|p| Ok(prompt_item(lineno, &p))),
    };
    match item {
        Ok(Ok(it)) => Ok(it),
        // The line is well formed but its `expected` names none of its choices.
        Ok(Err(msg)) => Err(vec![Diagnostic::line(path, lineno, 1, "expected", msg)]),
        Err(e) => Err(vec![Diagnostic::line(
            path,
            lineno,
            e.column(),
            "",
            e.to_string(),
        )]),
    }
}

/// serde_json appends " at line L column C"; the diagnostic already carries the position.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}
