//! JSONL item files (thousands of recorded decisions): one JSON object per line, each checked
//! against the item schema; every bad line is reported with its line and column.
use std::path::Path;

use serde_json::Value;

use super::diag::{display_path, ConfigErrors, Diagnostic};
use super::job::{decision_item, prompt_item, DecisionSpec, Item, Kind, PromptSpec};
use super::validate;

/// At most this many bad lines are listed; the rest are counted.
const MAX_REPORTED: usize = 20;

/// Reads the items of `path`; `Err(None)` when the file does not exist.
pub fn read_items(path: &Path, kind: Kind) -> Result<Vec<Item>, Option<ConfigErrors>> {
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
        Kind::Decide => crate::schema::item_schema::<DecisionSpec>(),
        _ => crate::schema::item_schema::<PromptSpec>(),
    };
    let mut items = Vec::new();
    let mut errs = Vec::new();
    let mut n_bad = 0usize;
    let mut push = |errs: &mut Vec<Diagnostic>, d: Diagnostic| {
        n_bad += 1;
        if errs.len() < MAX_REPORTED {
            errs.push(d);
        }
    };
    let src = display_path(path);
    for (ln, line) in text.lines().enumerate() {
        // Ids default to the line number (1-based), so they stay stable when lines are appended.
        let lineno = ln + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                push(
                    &mut errs,
                    Diagnostic {
                        source: src.clone(),
                        pos: Some((lineno, e.column().max(1))),
                        field: String::new(),
                        message: format!("not valid JSON: {}", strip_position(&e.to_string())),
                        // A JSONL line can be a whole prompt: no source snippet.
                        snippet: None,
                    },
                );
                continue;
            }
        };
        let violations = validate::validate(&schema, &v);
        if !violations.is_empty() {
            for vi in violations {
                push(
                    &mut errs,
                    Diagnostic {
                        source: src.clone(),
                        pos: Some((lineno, 1)),
                        field: vi.field,
                        message: vi.message,
                        snippet: None,
                    },
                );
            }
            continue;
        }
        let item = match kind {
            Kind::Decide => {
                serde_json::from_value::<DecisionSpec>(v).map(|d| decision_item(lineno, &d))
            }
            _ => serde_json::from_value::<PromptSpec>(v).map(|p| Ok(prompt_item(lineno, &p))),
        };
        match item {
            Ok(Ok(it)) => items.push(it),
            // The line is well formed but its `expected` names none of its choices.
            Ok(Err(msg)) => push(
                &mut errs,
                Diagnostic {
                    source: src.clone(),
                    pos: Some((lineno, 1)),
                    field: "expected".into(),
                    message: msg,
                    snippet: None,
                },
            ),
            Err(e) => push(
                &mut errs,
                Diagnostic {
                    source: src.clone(),
                    pos: Some((lineno, e.column().max(1))),
                    field: String::new(),
                    message: e.to_string(),
                    snippet: None,
                },
            ),
        }
    }
    if n_bad > errs.len() {
        errs.push(Diagnostic::file(
            path,
            format!("... and {} more bad lines", n_bad - errs.len()),
        ));
    }
    if !errs.is_empty() {
        return Err(Some(ConfigErrors(errs)));
    }
    if items.is_empty() {
        return Err(Some(
            Diagnostic::file(path, "holds no items (every line is blank)".into()).into(),
        ));
    }
    Ok(items)
}

/// serde_json appends " at line L column C"; the diagnostic already carries the position.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}
