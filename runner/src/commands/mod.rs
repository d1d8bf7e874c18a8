//! One module per command of the `bmoe` binary (`commands/<name>.rs`); `main` only parses and
//! dispatches. `one_shot` holds what generate, decide and ppl share, `output` what every command
//! prints with.
pub mod archs;
pub mod cache_sim;
pub mod check;
pub mod compare;
pub mod decide;
pub mod devices;
pub mod generate;
pub mod man;
pub mod merge;
mod one_shot;
pub mod output;
pub mod plan;
pub mod ppl;
pub mod profile;
pub mod report;
pub mod run;
pub mod schema;
pub mod synth;
pub mod unit_child;

/// Differences found (compare, schema --check) or items refused (run).
pub const EXIT_DIFF: u8 = 1;
/// Usage, configuration or I/O error.
pub const EXIT_ERROR: u8 = 2;
/// Stopped by Ctrl-C, SIGTERM or SIGHUP (the row in flight finished; resume with --resume).
pub const EXIT_STOPPED: u8 = 130;
