//! `bmoe __unit ARGS` (internal): a limited point's child. It prepares the run from the parent's
//! own `bmoe run` arguments, then runs the one unit its parent orders (`run::exec::run_child`).
use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::bail;
use clap::Parser;

use crate::cli::{Cli, Command};
use crate::run;
use crate::run::prepare::prepare;

/// Runs the child of a limited point; `args` are the parent's arguments (after the program).
pub fn unit_child(args: &[OsString]) -> anyhow::Result<ExitCode> {
    // Its own handler: Ctrl-C reaches the whole process group, and the row in flight finishes.
    let stop = run::signals::Stop::install();
    let argv = std::iter::once(OsString::from("bmoe")).chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv)?;
    let Command::Run(a) = cli.command else {
        bail!(
            "{} takes the arguments of a `bmoe run`",
            run::exec::CHILD_ARG
        );
    };
    bmoe_engine::set_log_verbose(cli.verbose);
    let shard = run::select::Shard::resolve(a.shard.as_deref(), &|k: &str| std::env::var(k).ok())?;
    let mut p = prepare(&a.target.jobs, &super::run::selection(&a))?;
    // The `--csv` the parent writes to (what `<csv>.explain.jsonl` sits beside).
    if let Some(c) = a.csv.as_deref() {
        let c = super::run::csv_override(c, shard)?;
        for j in &mut p.jobs {
            j.csv = c.clone();
        }
    }
    run::exec::run_child(&p, &stop)?;
    Ok(ExitCode::SUCCESS)
}
