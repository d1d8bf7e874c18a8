//! `bmoe schema`: the JSON Schemas written from the code, or checked against the files.
use std::process::ExitCode;

use super::EXIT_DIFF;
use crate::cli::SchemaArgs;

mod files;

/// Runs `bmoe schema`.
pub fn schema(a: SchemaArgs) -> anyhow::Result<ExitCode> {
    if a.check {
        let stale = files::stale(&a.out);
        if stale.is_empty() {
            println!("schemas in {} are current", a.out.display());
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!(
            "error: {} differ from the code in {}: run `bmoe schema --out {}`",
            stale.join(", "),
            a.out.display(),
            a.out.display()
        );
        return Ok(ExitCode::from(EXIT_DIFF));
    }
    files::write(&a.out)?;
    Ok(ExitCode::SUCCESS)
}
