//! Positioned configuration errors: each names the file, line:column, the field path and what was
//! expected; a file's errors are gathered and reported together.
use std::fmt;
use std::path::{Path, PathBuf};

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
        }
    }

    /// A diagnostic about a whole file (it is missing, unreadable, ...).
    pub fn file(file: &Path, message: String) -> Self {
        Self {
            source: display_path(file),
            pos: None,
            field: String::new(),
            message,
        }
    }

    /// A diagnostic about a non-file source (`--set`, an environment variable).
    pub fn other(source: impl Into<String>, field: &str, message: String) -> Self {
        Self {
            source: source.into(),
            pos: None,
            field: field.to_string(),
            message,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some((l, c)) = self.pos {
            write!(f, ":{l}:{c}")?;
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.field, self.message)
        }
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

/// A path as the user would recognise it: relative to the current directory when it is inside it.
pub fn display_path(p: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = p.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    p.display().to_string()
}

/// Joins `rel` onto the folder holding `file` (config paths are relative to their own file).
pub fn relative_to(file: &Path, rel: &str) -> PathBuf {
    let p = Path::new(rel);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    lexical_clean(&dir.join(p))
}

/// Removes `.` and `name/..` pairs without touching the filesystem, so messages stay readable.
fn lexical_clean(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                _ => out.push(c),
            },
            _ => out.push(c),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().collect()
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
    fn relative_paths() {
        assert_eq!(
            relative_to(Path::new("jobs/demo.toml"), "../models/tiny.gguf"),
            PathBuf::from("models/tiny.gguf")
        );
        assert_eq!(
            relative_to(Path::new("/x/j.toml"), "/abs"),
            PathBuf::from("/abs")
        );
    }

    #[test]
    fn format() {
        let d = Diagnostic {
            source: "jobs/x.toml".into(),
            pos: Some((3, 9)),
            field: "overrides.cache_mb".into(),
            message: "expected a non-negative integer or \"auto\", found \"lots\"".into(),
        };
        assert_eq!(
            d.to_string(),
            "jobs/x.toml:3:9: overrides.cache_mb: expected a non-negative integer or \"auto\", found \"lots\""
        );
    }
}
