//! `scripts/prune-builds` (run on the target folders kept between clones) removes the builds of
//! bmoe's own units made from clones that are gone, and nothing else: not a live clone's build,
//! not a dependency's, whose source may be gone too.
use std::path::Path;
use std::process::Command;

use crate::common::repo_root;

/// Writes a build of `unit` (hash `hash`) whose dep-info names `source`, with `files` beside it.
fn build(deps: &Path, unit: &str, hash: &str, source: &Path, files: &[&str]) {
    std::fs::create_dir_all(deps).unwrap();
    let out = deps.join(format!("{unit}-{hash}"));
    let line = format!(
        "{}: {} {}\n",
        out.display(),
        source.display(),
        source.display()
    );
    std::fs::write(deps.join(format!("{unit}-{hash}.d")), line).unwrap();
    for f in files {
        std::fs::write(deps.join(f.replace("HASH", hash)), b"x").unwrap();
    }
}

#[test]
fn only_builds_of_gone_clones_of_bmoes_units_are_removed() {
    let t = tempfile::tempdir().unwrap();
    let root = repo_root();
    let gone = Path::new("/nonexistent-clone/engine/src/lib.rs");
    let debug = t.path().join("debug/deps");
    let fuzz = t.path().join("x86_64-unknown-linux-gnu/release/deps");
    let lib = ["libbmoe_engine-HASH.rlib", "libbmoe_engine-HASH.rmeta"];
    build(&debug, "bmoe_engine", "0123456789abcdef", gone, &lib);
    build(
        &debug,
        "bmoe_engine",
        "fedcba9876543210",
        &root.join("engine/src/lib.rs"),
        &lib,
    );
    build(
        &debug,
        "serde",
        "1111111111111111",
        gone,
        &["libserde-HASH.rlib"],
    );
    build(
        &fuzz,
        "gguf_check",
        "2222222222222222",
        gone,
        &["gguf_check-HASH"],
    );
    let out = Command::new(root.join("scripts/prune-builds"))
        .arg(t.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        left(&debug),
        [
            "bmoe_engine-fedcba9876543210.d",
            "libbmoe_engine-fedcba9876543210.rlib",
            "libbmoe_engine-fedcba9876543210.rmeta",
            "libserde-1111111111111111.rlib",
            "serde-1111111111111111.d",
        ],
        "a live clone's build or a dependency's was removed, or a gone clone's kept"
    );
    assert!(
        left(&fuzz).is_empty(),
        "a gone clone's fuzz target was kept"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("(5 entries)"));
}
