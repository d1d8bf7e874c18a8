//! Positioned configuration errors: each names the file, line:column, the field path and what was
//! expected, then shows the source line with a caret (rendered by annotate-snippets, as rustc and
//! cargo do); a file's errors are gathered and reported together.
use std::fmt;
use std::path::Path;

use super::paths::display_path;

use annotate_snippets::{Level, Renderer, Snippet};

/// One problem in one configuration source.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    /// Where it came from: a file, or a label such as `--set` or `BMOE_CACHE_MB`.
    pub source: String,
    /// 1-based line and column, when the source is a file and the place is known.
    pub pos: Option<(usize, usize)>,
    /// The field path (`overrides.cache_mb`, `decisions[2].choices`); empty for the whole file.
    pub field: String,
    /// What is wrong, in words ("expected ..., found ...").
    pub message: String,
    /// The offending source line and the caret's place in it, when the source is a file.
    pub snippet: Option<Box<SourceLine>>,
    /// What would fix it, shown as a `help:` line under the error (boxed: a diagnostic is an
    /// error value, kept small).
    pub help: Option<Box<str>>,
}

/// One line of a configuration file, for showing it under the error.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceLine {
    /// 1-based line number.
    pub line: usize,
    /// The line's text, without its newline.
    pub text: String,
    /// Byte range of the caret within `text`.
    pub caret: std::ops::Range<usize>,
}

impl SourceLine {
    /// The line of `text` holding byte `offset`, with a caret under the character there.
    fn at(text: &str, offset: usize) -> Option<Self> {
        let mut o = offset.min(text.len());
        while !text.is_char_boundary(o) {
            o -= 1;
        }
        let start = text[..o].rfind('\n').map(|i| i + 1).unwrap_or(0);
        let end = text[o..].find('\n').map(|i| o + i).unwrap_or(text.len());
        let line_text = text[start..end].trim_end_matches('\r').to_string();
        if line_text.trim().is_empty() || line_text.len() > 300 {
            // Nothing to point at (an error at the end of the file), or a line too long to show.
            return None;
        }
        let col = (o - start).min(line_text.len());
        let width = line_text[col..]
            .chars()
            .next()
            .map(char::len_utf8)
            .unwrap_or(0);
        Some(Self {
            line: text[..start].matches('\n').count() + 1,
            text: line_text,
            caret: col..col + width,
        })
    }

    /// The line and its caret, as annotate-snippets draws them (plain, no colour), without the
    /// title line: the diagnostic's own first line already says what is wrong.
    fn render(&self) -> String {
        let msg = Level::Error.title("").snippet(
            Snippet::source(&self.text)
                .line_start(self.line)
                .annotation(Level::Error.span(self.caret.clone())),
        );
        let out = Renderer::plain().render(msg).to_string();
        let mut lines: Vec<&str> = out.lines().skip(1).collect();
        // The renderer closes with an empty gutter line; the next error follows directly instead.
        while lines
            .last()
            .is_some_and(|l| l.trim() == "|" || l.trim().is_empty())
        {
            lines.pop();
        }
        lines.join("\n")
    }
}

impl Diagnostic {
    /// A diagnostic about a file at a byte offset of its text.
    pub fn at(
        file: &Path,
        text: &str,
        offset: Option<usize>,
        field: &str,
        message: String,
    ) -> Self {
        Self {
            source: display_path(file),
            pos: offset.map(|o| line_col(text, o)),
            field: field.to_string(),
            message,
            snippet: offset.and_then(|o| SourceLine::at(text, o)).map(Box::new),
            help: None,
        }
    }

    /// A diagnostic about a whole file (it is missing, unreadable, ...).
    pub fn file(file: &Path, message: String) -> Self {
        Self {
            source: display_path(file),
            pos: None,
            field: String::new(),
            message,
            snippet: None,
            help: None,
        }
    }

    /// A diagnostic about a non-file source (`--set`, an environment variable).
    pub fn other(source: impl Into<String>, field: &str, message: String) -> Self {
        Self {
            source: source.into(),
            pos: None,
            field: field.to_string(),
            message,
            snippet: None,
            help: None,
        }
    }

    /// A diagnostic about line `line` (1-based) of a file shown without its text (a JSONL line
    /// can be a whole prompt).
    pub fn line(file: &Path, line: usize, column: usize, field: &str, message: String) -> Self {
        Self {
            source: display_path(file),
            pos: Some((line, column.max(1))),
            field: field.to_string(),
            message,
            snippet: None,
            help: None,
        }
    }

    /// The same diagnostic with a `help:` line.
    pub fn with_help(mut self, help: Option<String>) -> Self {
        self.help = help.map(String::into_boxed_str);
        self
    }

    /// The diagnostic as one entry of a JSON error document.
    pub fn json(&self) -> JsonDiagnostic {
        JsonDiagnostic {
            file: self.source.clone(),
            line: self.pos.map(|p| p.0),
            column: self.pos.map(|p| p.1),
            key: self.field.clone(),
            message: self.message.clone(),
            help: self.help.as_deref().map(str::to_string),
        }
    }
}

/// One error as `--format json` prints it (`{"ok": false, "errors": [...]}`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JsonDiagnostic {
    /// The file, or the non-file source (`--set cachemb=3`, `environment BMOE_CACHE_MB`).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field path; empty for the whole file.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// What would fix it, when known.
    pub help: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some((l, c)) = self.pos {
            write!(f, ":{l}:{c}")?;
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)?;
        } else {
            write!(f, ": {}: {}", self.field, self.message)?;
        }
        if let Some(s) = &self.snippet {
            write!(f, "\n{}", s.render())?;
        }
        if let Some(h) = &self.help {
            write!(f, "\nhelp: {h}")?;
        }
        Ok(())
    }
}

/// All the problems found in the configuration of one command; never empty.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<Diagnostic>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
                write!(f, "error: ")?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() > 1 {
            write!(f, "\n{} configuration errors", self.0.len())?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    /// The errors as one JSON document: `{"ok": false, "errors": [{"file", "line", "column",
    /// "key", "message", "help"}]}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": false,
            "errors": self.0.iter().map(Diagnostic::json).collect::<Vec<_>>(),
        })
    }
}

impl From<Diagnostic> for ConfigErrors {
    fn from(d: Diagnostic) -> Self {
        ConfigErrors(vec![d])
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    // Back off to a char boundary so slicing cannot panic on a span inside a multi-byte char.
    let mut o = offset;
    while !text.is_char_boundary(o) {
        o -= 1;
    }
    let before = &text[..o];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        let t = "a = 1\nbb = \"é\"\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, 11), (2, 6));
    }

    #[test]
    fn source_line_with_caret() {
        let text = "name = \"x\"\n[overrides]\ncache_mb = \"lots\"\n";
        let off = text.find("\"lots").unwrap();
        let d = Diagnostic::at(
            Path::new("jobs/x.toml"),
            text,
            Some(off),
            "overrides.cache_mb",
            "expected a non-negative integer".into(),
        );
        let s = d.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "jobs/x.toml:3:12: overrides.cache_mb: expected a non-negative integer"
        );
        assert!(
            lines.iter().any(|l| l.ends_with("3 | cache_mb = \"lots\"")),
            "{s}"
        );
        let caret = lines.iter().find(|l| l.contains('^')).unwrap();
        // The caret sits under the value's first character.
        let src = lines.iter().find(|l| l.contains("cache_mb =")).unwrap();
        assert_eq!(caret.find('^'), src.find('"'), "{s}");
    }

    #[test]
    fn format() {
        let d = Diagnostic {
            source: "jobs/x.toml".into(),
            pos: Some((3, 9)),
            field: "overrides.cache_mb".into(),
            message: "expected a non-negative integer or \"auto\", found \"lots\"".into(),
            snippet: None,
            help: None,
        };
        assert_eq!(
            d.to_string(),
            "jobs/x.toml:3:9: overrides.cache_mb: expected a non-negative integer or \"auto\", found \"lots\""
        );
    }
}
