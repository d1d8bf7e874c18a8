//! The runner's integration tests, in one test binary: each module runs the real `bmoe` binary
//! (or reads the repository) the way a user would. One binary rather than one per file: every file
//! linked its own copy of the dependencies (29 links in a cold build), and the harness packs the
//! tests of all modules onto the cores instead of running the files one after another.
//!
//! Run one module: `cargo test -p bmoe-runner --test cli -- examples::`.
mod common;
mod hostile;

mod auto_cache;
mod bad_input;
mod bench_table;
mod cache_sim;
mod check_json;
mod cli_hygiene;
mod compare;
mod compare_stats;
mod compare_verdicts;
mod decisions;
mod demo;
mod deploy;
mod direct_cli;
mod disk_floor;
mod examples;
mod fleet;
mod fuzz_corpus;
mod hostile_models;
mod layering;
mod load_once;
mod lossy;
mod memory_budget;
mod memory_limit;
mod memory_pressure;
mod no_effect;
mod probe;
mod prune_builds;
mod reader;
mod readme;
mod report;
mod resume;
mod retry_errors;
mod row_trust;
mod script_output;
mod settings;
mod shard_by;
mod slurm;
mod stock_runtime;
mod storage_faults;
mod telemetry_schema;
mod writers;
