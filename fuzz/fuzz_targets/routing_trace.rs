//! `cargo fuzz run routing_trace`: see `bmoe_engine::fuzzing::routing_trace`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe_engine::fuzzing::routing_trace(data));
