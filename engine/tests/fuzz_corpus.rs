//! The coverage-guided fuzz corpus (`fuzz/corpus/gguf`) and every crash a fuzz run saved
//! (`fuzz/regressions/<target>/`), replayed through the GGUF targets on every test run (stable
//! Rust, no libFuzzer): a case that panics or aborts fails here, naming the file first.
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
    let files = cases(&["corpus/gguf", &format!("regressions/{target}")]);
    assert!(
        files.len() >= 10,
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
