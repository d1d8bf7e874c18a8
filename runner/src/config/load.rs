//! Reading one TOML configuration file: syntax, then the JSON Schema, then the typed value; every
//! error of the file comes back together, positioned.
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::diag::{ConfigErrors, Diagnostic};
use super::spanned::{self, SpannedDoc};
use super::validate;

/// A configuration file as read: its text and where each value sits, for later semantic errors.
#[derive(Debug)]
pub struct SourceFile {
    /// The path as given.
    pub path: PathBuf,
    /// The text.
    pub text: String,
    /// Spans by JSON pointer.
    pub doc: SpannedDoc,
}

impl SourceFile {
    /// A diagnostic at the value (or, with `at_key`, the key) of `pointer`.
    pub fn diag(&self, pointer: &str, at_key: bool, message: String) -> Diagnostic {
        Diagnostic::at(
            &self.path,
            &self.text,
            self.doc.offset(pointer, at_key),
            &validate::field_path(pointer),
            message,
        )
    }
}

/// Reads `path` (`what` names it in messages: "profile", "job"), checks it against `schema` and
/// deserializes it.
pub fn load<T: DeserializeOwned>(
    path: &Path,
    what: &str,
    schema: &Value,
) -> Result<(T, SourceFile), ConfigErrors> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Diagnostic::file(path, format!("{what} file does not exist")).into())
        }
        Err(e) => {
            return Err(Diagnostic::file(path, format!("cannot read the {what} file: {e}")).into())
        }
    };
    let doc = match spanned::parse(&text) {
        Ok(d) => d,
        Err(errs) => {
            return Err(ConfigErrors(
                errs.into_iter()
                    .map(|e| {
                        Diagnostic::at(
                            path,
                            &text,
                            e.offset,
                            "",
                            format!("malformed TOML: {}", e.message),
                        )
                    })
                    .collect(),
            ))
        }
    };
    let src = SourceFile {
        path: path.to_path_buf(),
        text,
        doc,
    };
    let violations = validate::validate(schema, &src.doc.value);
    if !violations.is_empty() {
        let mut diags: Vec<Diagnostic> = violations
            .into_iter()
            .map(|v| {
                let mut d = src.diag(&v.pointer, v.at_key, v.message).with_help(v.help);
                d.field = v.field;
                d
            })
            .collect();
        diags.sort_by_key(|d| d.pos);
        return Err(ConfigErrors(diags));
    }
    match serde_json::from_value::<T>(src.doc.value.clone()) {
        Ok(v) => Ok((v, src)),
        // The schema is generated from T, so this means the two disagree: still say where.
        Err(e) => {
            Err(Diagnostic::file(path, format!("{what} does not match its type: {e}")).into())
        }
    }
}
