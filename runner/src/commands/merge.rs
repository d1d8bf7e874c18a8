//! `bmoe merge`: the CSVs of a sharded run joined into one.
use std::process::ExitCode;

use super::output::print_json;
use crate::cli::{Format, MergeArgs};
use crate::merge;

/// Runs `bmoe merge`.
pub fn merge(a: MergeArgs) -> anyhow::Result<ExitCode> {
    let opts = merge::MergeOptions {
        force: a.force,
        expect_shards: a.expect_shards,
        allow_partial: a.allow_partial,
    };
    let rep = merge::merge(&a.inputs, &a.output, &opts)?;
    if a.format == Format::Json {
        print_json(&rep)?;
    } else {
        // Only said when it happened, so the usual line stays as scripts know it.
        let retried = match rep.superseded {
            0 => String::new(),
            n => format!(", {n} failed row(s) superseded by their retry"),
        };
        println!(
            "merged {} file(s): {} rows in, {} identical duplicate(s) dropped{retried}, {} rows written to {} (schema {}; run(s) {}; job(s) {})",
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
