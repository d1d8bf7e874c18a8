//! `cargo fuzz run items_jsonl`: see `bmoe_runner::fuzzing::jsonl`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_runner::fuzzing::jsonl(data));
