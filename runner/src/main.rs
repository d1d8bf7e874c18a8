//! `bmoe`: the declarative batch runner over the bmoe engine (`check`, `plan`, `run`, `compare`,
//! `merge`, `schema`). The only place that reads the environment (`BMOE_*`, through the layering,
//! and the schedulers' shard variables).
//!
//! Exit status: 0 ok; 1 differences found (`compare`, `schema --check`) or items refused (`run`);
//! 2 usage, configuration or I/O error (clap's usage errors are 2 as well); 130 stopped by a signal.
mod cli;
mod commands;
mod compare;
mod config;
mod direct;
mod ident;
mod merge;
mod placement;
mod probe;
mod report;
mod run;
mod schema;
mod sink;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // llama.cpp's log is noise unless asked for; -v asks, in one-shot commands and runs alike.
    bmoe_engine::set_log_verbose(cli.verbose);
    match dispatch(cli.command, cli.quiet, cli.verbose) {
        Ok(code) => code,
        Err(e) => {
            // Display, never Debug: no backtrace on user input, whatever RUST_BACKTRACE says.
            eprintln!("error: {e:#}");
            ExitCode::from(commands::EXIT_ERROR)
        }
    }
}

/// Hands each command to its module.
fn dispatch(cmd: Command, quiet: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cmd {
        Command::Devices(a) => done(direct::run_devices(a)),
        Command::Synth(a) => done(direct::run_synth(a)),
        Command::Archs(a) => done(direct::run_archs(a)),
        Command::Generate(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_generate(a))
        }
        Command::Decide(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_decide(a))
        }
        Command::Ppl(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_ppl(a))
        }
        Command::Probe { model } => done(probe::run_child(&model)),
        Command::Check(a) => commands::check::check(a),
        Command::Plan(t) => commands::plan::plan(t),
        Command::Run(a) => commands::run::run(a, quiet),
        Command::Merge(a) => commands::merge::merge(a),
        Command::Completions(a) => done(commands::man::completions(a)),
        Command::Man(a) => done(commands::man::write_man(a.out.as_deref())),
        Command::Report(a) => commands::report::report(a),
        Command::Compare(a) => commands::compare::compare(a),
        Command::Schema(a) => commands::schema::schema(a),
    }
}
