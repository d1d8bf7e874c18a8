//! What every command shares for output: JSON on stdout, warnings on stderr, atomic files.
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::config::diag::display_path;
use crate::run::prepare::Prepared;

/// Prints a value as pretty JSON on stdout. A closed stdout is a `BrokenPipe` I/O error (serde's
/// own error hides it), which `main` ends quietly, as for the text printers.
pub fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)
        .map_err(std::io::Error::from)
        .context("writing JSON to stdout")?;
    writeln!(out).context("writing JSON to stdout")
}

pub fn print_warnings(p: &Prepared) {
    for w in &p.warnings {
        eprintln!("{}: {w}", label("warning"));
    }
}

/// `error`, `warning` or `help`, in bold colour when stderr is a terminal and `NO_COLOR` is not
/// set (no-color.org), as clap colours its own errors; plain otherwise.
pub fn label(kind: &str) -> String {
    use std::io::IsTerminal as _;
    let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::io::stderr().is_terminal();
    let code = match kind {
        "error" => "1;31",
        "warning" => "1;33",
        _ => "1;36",
    };
    if colour {
        format!("\x1b[{code}m{kind}\x1b[0m")
    } else {
        kind.to_string()
    }
}

/// Writes `text` to `path` through a temporary file in the same folder, so a failure leaves
/// nothing half-written.
pub fn write_atomic(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Like a job's CSV, an output's folder is created on first use.
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A report or overlay is an ordinary file: 0666 less the umask, as merge's output.
    let mut tmp = crate::sink::temp_builder()
        .tempfile_in(&dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A command that failed before it ran: with `--format json`, the errors as
/// `{"ok": false, "errors": [...]}` on stdout (configuration errors one by one, with file, line,
/// column and key), the text on stderr as always, and exit 2; in text, the error as it is.
pub fn fail(
    e: anyhow::Error,
    format: crate::cli::Format,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::config::diag::{ConfigErrors, Diagnostic};
    if format != crate::cli::Format::Json {
        return Err(e);
    }
    eprintln!("error: {e:#}");
    let doc = match e.downcast_ref::<ConfigErrors>() {
        Some(c) => c.json(),
        None => ConfigErrors(vec![Diagnostic::other("", "", format!("{e:#}"))]).json(),
    };
    print_json(&doc)?;
    Ok(std::process::ExitCode::from(super::EXIT_ERROR))
}

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
/// same file however spelled, links included), and an existing file that is not `kind`'s own
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
