//! What an output path may replace: never an input, and an existing file only when it is the
//! writing command's own kind (recognised by content) or with `--force`. Shared by `report -o`,
//! `report --write-overrides`, `synth -o`, `man -o` and `merge -o`.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::config::paths::display_path;

/// What a command writes to an output path, recognised by its content: a file of the command's
/// own kind (an earlier run's output) is replaced, any other only with `--force`, and an input
/// never ([`check_output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// `report -o`: its HTML page, Markdown or JSON document.
    Report,
    /// `report --write-overrides`: a TOML overlay with its header comment.
    Overlay,
    /// `synth -o`: a GGUF model.
    Gguf,
    /// `man -o DIR`: a troff page.
    ManPage,
    /// `merge -o`: an existing file is never replaced without `--force`.
    Csv,
}

impl OutputKind {
    /// The kind as an error names it (`not a bmoe report`).
    fn what(self) -> &'static str {
        match self {
            OutputKind::Report => "a bmoe report (HTML, Markdown or JSON)",
            OutputKind::Overlay => "an overlay written by `bmoe report --write-overrides`",
            OutputKind::Gguf => "a GGUF model",
            OutputKind::ManPage => "a man page",
            OutputKind::Csv => "",
        }
    }

    /// Whether a file starting with `head` is this kind's own.
    fn recognises(self, head: &[u8]) -> bool {
        let text = String::from_utf8_lossy(head);
        match self {
            OutputKind::Report => {
                text.starts_with("# bmoe report\n")
                    || (text.starts_with("<!DOCTYPE html>")
                        && text.contains("<title>bmoe report</title>"))
                    || (text.starts_with('{') && text.contains("\"format\": \"bmoe-report\""))
            }
            OutputKind::Overlay => text.starts_with("# Written by `bmoe report"),
            OutputKind::Gguf => head.starts_with(b"GGUF"),
            OutputKind::ManPage => text.starts_with(".TH ") || text.contains("\n.TH "),
            OutputKind::Csv => false,
        }
    }
}

/// Refuses an output before anything is computed or written: one that is one of `inputs` (the
/// same file however spelled, symbolic links included), and an existing file that is not `kind`'s own
/// unless `force`. `flag` names the option (`-o`, `--write-overrides`) in the message.
pub fn check_output(
    output: &Path,
    inputs: &[PathBuf],
    kind: OutputKind,
    flag: &str,
    force: bool,
) -> anyhow::Result<()> {
    let shown = display_path(output);
    if let Some(i) = inputs.iter().find(|i| same_file(i, output)) {
        let also = if display_path(i) == shown {
            String::new()
        } else {
            format!(" ({})", display_path(i))
        };
        bail!("{flag} {shown} is also an input{also}; write to another file");
    }
    if force || !output.exists() {
        return Ok(());
    }
    if kind == OutputKind::Csv {
        bail!("{shown} exists; choose another {flag}, or add --force to replace it");
    }
    let mut head = Vec::new();
    if !output.is_dir() {
        let f = std::fs::File::open(output).with_context(|| format!("reading {shown}"))?;
        std::io::Read::read_to_end(&mut std::io::Read::take(f, 4096), &mut head)
            .with_context(|| format!("reading {shown}"))?;
    }
    if kind.recognises(&head) {
        return Ok(());
    }
    bail!(
        "{flag} {shown} exists and is not {}; choose another {flag}, or add --force to replace it",
        kind.what()
    )
}

/// Whether two paths name the same file (canonicalized; as given when either does not exist).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input is refused by any spelling or link, even with `force`; an existing file of
    /// another kind only without `force`; the kind's own file and a new path pass.
    #[test]
    fn inputs_never_and_foreign_files_only_with_force() {
        let d = tempfile::tempdir().unwrap();
        let csv = d.path().join("runs/x.csv");
        std::fs::create_dir_all(d.path().join("runs")).unwrap();
        std::fs::write(&csv, "job,profile,point,item\n").unwrap();
        let link = d.path().join("link.csv");
        std::os::unix::fs::symlink(&csv, &link).unwrap();
        let inputs = [csv.clone()];
        for out in [d.path().join("runs/../runs/x.csv"), link] {
            for force in [false, true] {
                let e = check_output(&out, &inputs, OutputKind::Report, "-o", force);
                assert!(e.unwrap_err().to_string().contains("is also an input"));
            }
        }
        let md = d.path().join("r.md");
        assert!(check_output(&md, &inputs, OutputKind::Report, "-o", false).is_ok());
        std::fs::write(&md, "# bmoe report\n\n").unwrap();
        assert!(check_output(&md, &inputs, OutputKind::Report, "-o", false).is_ok());
        let e = check_output(
            &md,
            &inputs,
            OutputKind::Overlay,
            "--write-overrides",
            false,
        );
        assert!(e.unwrap_err().to_string().contains("is not an overlay"));
        assert!(check_output(&md, &inputs, OutputKind::Overlay, "--write-overrides", true).is_ok());
        let e = check_output(&md, &inputs, OutputKind::Csv, "-o", false).unwrap_err();
        assert!(e
            .to_string()
            .contains("exists; choose another -o, or add --force"));
    }
}
