//! What every command shares for output: JSON on stdout, warnings on stderr, atomic files.
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

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
