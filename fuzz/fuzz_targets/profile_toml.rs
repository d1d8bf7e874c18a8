//! `cargo fuzz run profile_toml`: see `bmoe_runner::fuzzing::profile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_runner::fuzzing::profile(data));
