//! `bmoe merge`: the CSVs of a sharded run joined into one.
use std::process::ExitCode;

use super::output::print_json;
use crate::cli::{Format, MergeArgs};
use crate::merge;

/// Runs `bmoe merge`.
pub fn merge(a: MergeArgs) -> anyhow::Result<ExitCode> {
    let rep = merge::merge(&a.inputs, &a.output, a.force)?;
    if a.format == Format::Json {
        print_json(&rep)?;
    } else {
        println!(
            "merged {} file(s): {} rows in, {} identical duplicate(s) dropped, {} rows written to {} (schema {}; run(s) {}; job(s) {})",
            rep.inputs,
            rep.rows_in,
            rep.duplicates,
            rep.rows_out,
            rep.output,
            rep.schema_version,
            rep.runs.join(", "),
            rep.jobs.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
