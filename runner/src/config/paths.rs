//! Paths in messages and in configuration: a file named as the user would recognise it, and a
//! path in a config file joined onto that file's folder.
use std::path::{Path, PathBuf};

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
}
