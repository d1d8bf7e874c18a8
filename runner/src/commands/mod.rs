//! One module per command of the `bmoe` binary; `main` only parses and dispatches. The one-shot
//! engine commands (generate, decide, ppl, devices, synth, archs) live in `direct/`.
pub mod cache_sim;
pub mod check;
pub mod compare;
pub mod man;
pub mod merge;
pub mod output;
pub mod plan;
pub mod profile;
pub mod report;
pub mod run;
pub mod schema;

/// Differences found (compare, schema --check) or items refused (run).
pub const EXIT_DIFF: u8 = 1;
/// Usage, configuration or I/O error.
pub const EXIT_ERROR: u8 = 2;
/// Stopped by Ctrl-C, SIGTERM or SIGHUP (the row in flight finished; resume with --resume).
pub const EXIT_STOPPED: u8 = 130;
