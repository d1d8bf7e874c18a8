//! `cargo fuzz run telemetry_csv`: see `bmoe_runner::fuzzing::csv`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_runner::fuzzing::csv(data));
