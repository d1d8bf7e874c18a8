//! `cargo fuzz run gguf_rebuild`: see `bmoe_engine::fuzzing::gguf_rebuild`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_engine::fuzzing::gguf_rebuild(data));
