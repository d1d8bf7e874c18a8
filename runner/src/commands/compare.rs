//! `bmoe compare`: two runs side by side, for nightly regression checks.
use std::process::ExitCode;

use super::output::print_json;
use super::EXIT_DIFF;
use crate::cli::{CompareArgs, Format};
use crate::compare;

/// Runs `bmoe compare`.
pub fn compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let rep = compare::compare(
        &a.a,
        &a.b,
        &compare::CompareOptions {
            run_a: a.run_a,
            run_b: a.run_b,
            tolerance: a.tolerance,
        },
    )?;
    if a.format == Format::Json {
        print_json(&rep.json())?;
    } else {
        print!("{}", rep.render());
    }
    // As diff: 1 when the runs differ, so CI tells a regression (1) from trouble (2).
    let _ = a.fail_on_diff;
    if !rep.identical() {
        return Ok(ExitCode::from(EXIT_DIFF));
    }
    Ok(ExitCode::SUCCESS)
}
