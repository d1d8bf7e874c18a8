//! The coverage-guided fuzz corpus (`fuzz/corpus/gguf`, `fuzz/corpus/routing_trace`) and every
//! crash a fuzz run saved (`fuzz/regressions/<target>/`), replayed through the engine's targets
//! on every test run (stable Rust, no libFuzzer): a case that panics or aborts fails here, naming
//! the file first.
use std::path::{Path, PathBuf};

fn cases(dirs: &[&str]) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for d in dirs {
        if let Ok(entries) = std::fs::read_dir(root.join(d)) {
            out.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    out.sort();
    out
}

fn replay(target: &str, run: fn(&[u8])) {
    replay_from("corpus/gguf", target, run);
}

fn replay_from(corpus: &str, target: &str, run: fn(&[u8])) {
    let files = cases(&[corpus, &format!("regressions/{target}")]);
    assert!(
        files.len() >= 5,
        "{target}: the corpus is missing ({} files)",
        files.len()
    );
    for f in files {
        // Before the case: an abort in ggml ends the process without a Rust message.
        eprintln!("{target}: {}", f.display());
        run(&std::fs::read(&f).unwrap());
    }
}

#[test]
fn gguf_check_corpus() {
    replay("gguf_check", bmoe_engine::fuzzing::gguf_check);
}

#[test]
fn gguf_index_corpus() {
    replay("gguf_index", bmoe_engine::fuzzing::gguf_index);
}

#[test]
fn gguf_rebuild_corpus() {
    replay("gguf_rebuild", bmoe_engine::fuzzing::gguf_rebuild);
}

#[test]
fn routing_trace_corpus() {
    replay_from(
        "corpus/routing_trace",
        "routing_trace",
        bmoe_engine::fuzzing::routing_trace,
    );
}

/// Found by `gguf_index` (a 30-minute run, issue 55): `qwen35moe.block_count` = 16,121,860 made
/// `GgufIndex::layers` size its answer from the header before any check (10 s and gigabytes under
/// the fuzzer). The index now reports at most llama.cpp's 512 layers.
#[test]
fn a_huge_block_count_is_bounded_before_any_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/gguf_index");
    let bytes = std::fs::read(root.join("timeout-block-count-16m-layers.gguf")).unwrap();
    assert_eq!(bmoe_engine::fuzzing::index_layers(&bytes), Some(512));
}
