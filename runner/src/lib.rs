//! The runner as a library: the modules the `bmoe` binary (`main.rs`) is made of, named here so
//! that the fuzz targets (`fuzz/`) can drive the readers (profiles, jobs, JSONL, CSV) in process.
//! Nothing outside this repository is meant to depend on it.
pub mod cli;
pub mod commands;
pub mod compare;
pub mod config;
pub mod fuzzing;
pub mod ident;
pub mod load_probe;
pub mod merge;
pub mod placement;
pub mod report;
pub mod run;
pub mod sink;
