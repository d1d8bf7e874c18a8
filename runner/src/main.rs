//! `bmoe`: the declarative batch runner over the bmoe engine (`check`, `plan`, `run`, `compare`,
//! `merge`, `schema`). The only place that reads the environment (`BMOE_*`, through the layering,
//! and the schedulers' shard variables).
//!
//! Exit status: 0 ok; 1 differences found (`compare`, `schema --check`) or items refused (`run`);
//! 2 usage, configuration or I/O error (clap's usage errors are 2 as well); 130 stopped by a signal.
use bmoe_runner::{cli, commands, ident, load_probe, run};

use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};

use clap::{CommandFactory, FromArgMatches};

use cli::{Cli, Command};

/// The exit status when stdout's reader goes away (`bmoe plan | head`): 0 for a command that
/// only prints, as ripgrep and cargo do; a run stopped early is not a success.
static BROKEN_PIPE_EXIT: AtomicU8 = AtomicU8::new(0);

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    // The probe's and a limited point's children are internal: not clap commands, so no
    // completion or man page offers them.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == load_probe::CHILD_ARG) {
        return match args.get(2) {
            Some(model) => finish(
                load_probe::run_child(std::path::Path::new(model)).map(|()| ExitCode::SUCCESS),
            ),
            None => finish(Err(anyhow::anyhow!(
                "{} needs a model path",
                load_probe::CHILD_ARG
            ))),
        };
    }
    if args.get(1).is_some_and(|a| a == run::exec::CHILD_ARG) {
        return finish(commands::unit_child::unit_child(&args[2..]));
    }
    let mut cmd = Cli::command();
    // The backends and CPU features come from ggml's registry: asked for only when printed.
    if args.iter().any(|a| a == "--version") {
        cmd = cmd.long_version(ident::long_version());
    }
    let matches = cmd.get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // llama.cpp's log is noise unless asked for; -v asks, in one-shot commands and runs alike.
    bmoe_engine::set_log_verbose(cli.verbose);
    if matches!(cli.command, Command::Run(_)) {
        BROKEN_PIPE_EXIT.store(commands::EXIT_STOPPED, Ordering::Relaxed);
    }
    finish(dispatch(cli.command, cli.quiet, cli.verbose))
}

/// The exit status of a command's result; an error is printed once, as a line.
fn finish(r: anyhow::Result<ExitCode>) -> ExitCode {
    match r {
        Ok(code) => code,
        Err(e) if broken_pipe(&e) => ExitCode::from(BROKEN_PIPE_EXIT.load(Ordering::Relaxed)),
        Err(e) => {
            // Display, never Debug: no backtrace on user input, whatever RUST_BACKTRACE says.
            eprintln!("{}: {e:#}", commands::output::label("error"));
            ExitCode::from(commands::EXIT_ERROR)
        }
    }
}

/// Whether an error comes from writing to a pipe whose reader has gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` panics when stdout's reader has gone (`bmoe plan | head -3`); that is not a crash
/// but the reader saying it has seen enough, so the process ends quietly instead. Every other
/// panic keeps the default report.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(i32::from(BROKEN_PIPE_EXIT.load(Ordering::Relaxed)));
        }
        default(info);
    }));
}

/// Hands each command to its module.
fn dispatch(cmd: Command, quiet: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cmd {
        Command::Devices(a) => done(commands::devices::devices(a)),
        Command::Synth(a) => done(commands::synth::synth(a)),
        Command::Archs(a) => done(commands::archs::archs(a)),
        Command::Generate(mut a) => {
            a.engine.verbose = verbose;
            done(commands::generate::generate(a))
        }
        Command::Decide(mut a) => {
            a.engine.verbose = verbose;
            done(commands::decide::decide(a))
        }
        Command::Ppl(mut a) => {
            a.engine.verbose = verbose;
            done(commands::ppl::ppl(a))
        }
        Command::CacheSim(a) => commands::cache_sim::cache_sim(a),
        Command::Check(a) => commands::check::check(a),
        Command::Plan(t) => commands::plan::plan(t),
        Command::Run(a) => commands::run::run(a, quiet),
        Command::Merge(a) => commands::merge::merge(a),
        Command::Completions(a) => done(commands::man::completions(a)),
        Command::Man(a) => done(commands::man::write_man(a.out.as_deref(), a.force)),
        Command::Report(a) => commands::report::report(a),
        Command::Compare(a) => commands::compare::compare(a),
        Command::Schema(a) => commands::schema::schema(a),
        Command::Profile(c) => commands::profile::profile(c),
    }
}
