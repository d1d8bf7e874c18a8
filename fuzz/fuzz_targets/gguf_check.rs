//! `cargo fuzz run gguf_check`: see `bmoe_engine::fuzzing::gguf_check`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_engine::fuzzing::gguf_check(data));
