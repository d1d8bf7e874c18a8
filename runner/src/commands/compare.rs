//! `bmoe compare`: two runs side by side, for nightly regression checks.
use std::process::ExitCode;

use super::output::print_json;
use super::{EXIT_DIFF, EXIT_ERROR};
use crate::cli::{CompareArgs, Format};
use crate::compare::{self, Verdict};

/// Runs `bmoe compare`: exit 0 same, 1 differ (or a speed gate tripped), 2 nothing in common.
pub fn compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let rep = compare::compare(
        &a.a,
        &a.b,
        &compare::CompareOptions {
            run_a: a.run_a,
            run_b: a.run_b,
            tolerance: a.tolerance,
            max_slowdown: a.max_slowdown,
        },
    )?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    if a.format == Format::Json {
        print_json(&rep.json())?;
    } else {
        print!("{}", rep.render());
    }
    // As diff: 1 when the runs differ, so CI tells a regression (1) from trouble (2).
    let _ = a.fail_on_diff;
    Ok(match rep.verdict() {
        Verdict::Same => ExitCode::SUCCESS,
        Verdict::Differ => ExitCode::from(EXIT_DIFF),
        Verdict::NothingInCommon => ExitCode::from(EXIT_ERROR),
    })
}
