//! Damaged models at the engine boundary: each check made before llama.cpp loads a file names the
//! key or tensor, and a C++ exception from llama.cpp comes back as a typed error, not an abort.
mod common;

use std::path::PathBuf;

use bmoe_engine::{EngineError, LoadOptions, Model};

/// The tiny model with `old` (found once) replaced by `new`, written under `name`.
fn damaged(name: &str, old: &[u8], new: &[u8]) -> PathBuf {
    let mut b = std::fs::read(common::tiny()).unwrap();
    let hits: Vec<usize> = b
        .windows(old.len())
        .enumerate()
        .filter(|(_, w)| *w == old)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1);
    b[hits[0]..hits[0] + new.len()].copy_from_slice(new);
    let p = common::dir().join(name);
    std::fs::write(&p, b).unwrap();
    p
}

fn refusal(p: &PathBuf) -> String {
    match Model::load(&LoadOptions::new(p)) {
        Err(e @ EngineError::Invalid { .. }) => e.to_string(),
        Err(e) => panic!("refused, but not by a check: {e}"),
        Ok(_) => panic!("{} loaded", p.display()),
    }
}

#[test]
fn duplicate_tokens_are_refused_before_llama_cpp_asserts() {
    let p = damaged("dup.gguf", b"<0x41>", b"<0x42>");
    let e = refusal(&p);
    assert!(
        e.contains("dup.gguf: tokenizer.ggml.tokens: tokens 68 and 69 are both \"<0x42>\""),
        "{e}"
    );
}

#[test]
fn missing_byte_tokens_are_refused() {
    let p = damaged("nobyte.gguf", b"<0x68>", b"<0x6G>");
    let e = refusal(&p);
    assert!(
        e.contains("<0x68> is missing (1 of 256 byte tokens missing)"),
        "{e}"
    );
}

#[test]
fn a_streamed_load_of_a_file_without_a_required_weight_is_an_error_not_a_crash() {
    // blk.0.attn_q.weight renamed: the file lacks a weight the graph always reads. The lean load
    // finds no neutral value for it and gives way to llama.cpp's load, which refuses the file. It
    // must not take the tensor out of the layer first (the graph builder would then read a null
    // tensor: a segfault, seen when the unlink ran before that check).
    let p = damaged("noq.gguf", b"blk.0.attn_q.weight", b"blk.0.attn_X.weight");
    let e = Model::load(&LoadOptions {
        stream: common::gates::stream(0, false),
        ..LoadOptions::new(&p)
    })
    .err()
    .expect("a file without a required weight must not load");
    assert!(e.to_string().contains("attn_q"), "{e}");
}
