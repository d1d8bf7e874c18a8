//! `cargo fuzz run gguf_index`: see `bmoe_engine::fuzzing::gguf_index`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_engine::fuzzing::gguf_index(data));
