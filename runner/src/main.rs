//! `bmoe`: the command line. Parses arguments, wires the pieces, reports errors with context.
mod direct;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run Mixture-of-Experts models larger than RAM, as declarative batch jobs.
#[derive(Debug, Parser)]
#[command(name = "bmoe", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the ggml backends and devices of this build.
    Devices(direct::DevicesArgs),
    /// Write a synthetic MoE GGUF.
    Synth(direct::SynthArgs),
    /// Generate text once.
    Generate(direct::GenerateArgs),
    /// Score choices after a prompt (one prefill, no decode).
    Decide(direct::DecideArgs),
    /// Perplexity of a text file.
    Ppl(direct::PplArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(a) => direct::run_devices(a),
        Command::Synth(a) => direct::run_synth(a),
        Command::Generate(a) => direct::run_generate(a),
        Command::Decide(a) => direct::run_decide(a),
        Command::Ppl(a) => direct::run_ppl(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Display with causes, never Debug: no backtrace even with RUST_BACKTRACE=1.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
