//! `cargo fuzz run job_toml`: see `bmoe_runner::fuzzing::job`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_runner::fuzzing::job(data));
