//! The coverage-guided fuzz corpora of the readers (`fuzz/corpus/<target>`) and every crash a fuzz
//! run saved (`fuzz/regressions/<target>/`), replayed in process on every test run (stable Rust,
//! no libFuzzer): a case that panics fails here with the file's name.
use std::path::{Path, PathBuf};

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files: Vec<PathBuf> = Vec::new();
    for d in [format!("corpus/{target}"), format!("regressions/{target}")] {
        if let Ok(entries) = std::fs::read_dir(root.join(d)) {
            files.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    files.sort();
    assert!(files.len() >= 2, "{target}: the corpus is missing");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let r = std::panic::catch_unwind(|| run(&bytes));
        assert!(r.is_ok(), "{target}: {} panicked", f.display());
    }
}

#[test]
fn profile_corpus() {
    replay("profile_toml", bmoe_runner::fuzzing::profile);
}

#[test]
fn job_corpus() {
    replay("job_toml", bmoe_runner::fuzzing::job);
}

#[test]
fn jsonl_corpus() {
    replay("items_jsonl", bmoe_runner::fuzzing::jsonl);
}

#[test]
fn csv_corpus() {
    replay("telemetry_csv", bmoe_runner::fuzzing::csv);
}
