//! `bmoe compare`: two runs side by side, for nightly regression checks.
use std::process::ExitCode;

use super::output::print_json;
use super::{EXIT_DIFF, EXIT_ERROR};
use crate::cli::{CompareArgs, Format};
use crate::compare::groups::{DEFAULT_MAX_ACCURACY_DROP, DEFAULT_MIN_AGREEMENT};
use crate::compare::{self, Gates, Verdict};
use crate::config::paths::display_path;

/// Runs `bmoe compare`: exit 0 same, 1 differ (or a speed gate tripped), 2 nothing in common;
/// with `--fail-on-regression`, 1 only when a group crosses a threshold.
pub fn compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let gates = a.fail_on_regression.then(|| Gates {
        max_accuracy_drop: a.max_accuracy_drop.unwrap_or(DEFAULT_MAX_ACCURACY_DROP),
        min_agreement: a.min_agreement.unwrap_or(DEFAULT_MIN_AGREEMENT),
        max_slowdown: a.max_slowdown,
    });
    let rep = compare::compare(
        &a.a,
        &a.b,
        &compare::CompareOptions {
            run_a: a.run_a,
            run_b: a.run_b,
            tolerance: a.tolerance,
            max_slowdown: a.max_slowdown,
            gates,
        },
    )?;
    // The speed warnings go with the reading ones: JSON carries them under each `speed` metric.
    let speed = rep.speed();
    let speed_warnings = speed.iter().flat_map(|m| &m.warnings);
    for w in rep.warnings.iter().chain(speed_warnings) {
        eprintln!("warning: {w}");
    }
    if rep.same_run() {
        // A mis-set baseline path must not pass CI as "identical".
        eprintln!(
            "{}: A and B are the same run (run {}, read from {} and {}: every row equal, written at the same times); nothing was compared",
            super::output::label("warning"),
            rep.runs.0,
            display_path(&a.a),
            display_path(&a.b)
        );
        return Ok(ExitCode::from(EXIT_ERROR));
    }
    if a.format == Format::Json {
        print_json(&rep.json())?;
    } else {
        print!("{}", rep.render());
    }
    // As diff: 1 when the runs differ, so CI tells a regression (1) from trouble (2).
    let _ = a.fail_on_diff;
    Ok(match rep.verdict() {
        Verdict::Same | Verdict::NoRegression => ExitCode::SUCCESS,
        Verdict::Differ | Verdict::Regression => ExitCode::from(EXIT_DIFF),
        Verdict::NothingInCommon => ExitCode::from(EXIT_ERROR),
    })
}
