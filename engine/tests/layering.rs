//! Imports run one way: every engine module sits on a layer and names only modules on layers
//! below it (`crate::` paths outside `#[cfg(test)]` code). A new module, or an import that points
//! up, fails here with the file, the line and the two layers. The layers are the ones
//! `docs/architecture.md` describes.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The engine's top-level modules, lowest layer first. A module may name modules of lower layers
/// only; modules on one layer do not name each other.
const LAYERS: &[&[&str]] = &[
    &["ffi"],
    &["error", "telemetry", "io"],
    &["settings", "chat"],
    &["options"],
    &["gguf"],
    &["graph"],
    &["weights"],
    &["stream"],
    &["device"],
    &["plan"],
    &["model"],
    &["session"],
    &["tokenizer"],
    &["fuzzing"],
];

#[path = "support/import_graph.rs"]
mod import_graph;

use import_graph::{file_cycle, module_cycle, references, rust_files};

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a file of `src` belongs to (`None` for the crate root).
fn top_level(src: &Path, file: &Path) -> Option<String> {
    import_graph::module_of(src, file).first().cloned()
}

/// The references that break the layering, as messages.
fn violations(src: &Path) -> Vec<String> {
    import_graph::layer_violations(src, LAYERS)
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn engine_modules_import_one_way() {
    let bad = violations(&src_dir());
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn engine_module_graph_has_no_cycle() {
    if let Some(c) = module_cycle(&src_dir()) {
        panic!("import cycle between engine modules: {}", c.join(" -> "));
    }
}

/// No circle between files either, inside a folder included: a reader of `ffi/` can start at the
/// bottom file and read upwards.
#[test]
fn engine_files_import_without_a_circle() {
    if let Some(c) = file_cycle(&src_dir()) {
        panic!("import circle between engine files: {}", c.join(" -> "));
    }
    // The scan itself finds what it looks for: files inside folders name each other.
    let inner = import_graph::references_inside_folders(&src_dir());
    assert!(inner > 20, "only {inner} references inside folders");
}

#[test]
fn every_top_level_module_is_on_a_layer() {
    let missing: BTreeSet<String> = rust_files(&src_dir())
        .iter()
        .filter_map(|f| top_level(&src_dir(), f))
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(missing.is_empty(), "modules on no layer: {missing:?}");
}

/// What opens an unsafe block, fn, impl or trait.
const UNSAFE: &[&str] = &[
    "unsafe {",
    "unsafe fn",
    "unsafe impl",
    "unsafe extern",
    "unsafe trait",
];

/// Lines of `dir`'s Rust files (outside the folders in `skip`) whose code (not a comment) holds
/// one of `patterns`, as `file:line: text`.
fn lines_with(dir: &Path, skip: &[PathBuf], patterns: &[&str]) -> Vec<String> {
    let files = rust_files(dir);
    let mut out = Vec::new();
    for f in files
        .iter()
        .filter(|f| !skip.iter().any(|s| f.starts_with(s)))
    {
        let text = std::fs::read_to_string(f).expect("read source");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if patterns.iter().any(|k| code.contains(k)) {
                out.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn unsafe_lives_in_the_ffi_module_only() {
    let engine = src_dir();
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runner/src");
    let mut bad = lines_with(&engine, &[engine.join("ffi")], UNSAFE);
    bad.extend(lines_with(&runner, &[], UNSAFE));
    assert!(
        bad.is_empty(),
        "unsafe outside ggml-sys and engine/src/ffi:\n{}",
        bad.join("\n")
    );
    // The scan itself finds what it looks for.
    assert!(!lines_with(&engine.join("ffi"), &[], UNSAFE).is_empty());
}

/// The calls that move a weight tensor (rebind its data, re-type it, restore or detach its
/// binding, bind it into a device buffer).
const MOVES: &[&str] = &[
    ".rebind(",
    ".set_layout(",
    ".restore(",
    ".detach(",
    ".bind(",
];

#[test]
fn only_the_residency_owner_moves_weights() {
    let engine = src_dir();
    let bad = lines_with(
        &engine,
        &[engine.join("ffi"), engine.join("weights")],
        MOVES,
    );
    assert!(
        bad.is_empty(),
        "a weight moved outside engine/src/weights (the one residency owner):\n{}",
        bad.join("\n")
    );
    // The scan itself finds what it looks for: the owner's own moves.
    assert!(lines_with(&engine.join("weights"), &[], MOVES).len() >= 4);
}

#[test]
fn the_checker_sees_an_upward_import() {
    // The checker itself can fail: a scratch tree where `graph` names `session`.
    let d = tempfile::tempdir().expect("tempdir");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("graph")).expect("mkdir");
    std::fs::write(src.join("session.rs"), "use crate::graph::x;\n").expect("write");
    std::fs::write(src.join("ffi.rs"), "").expect("write");
    std::fs::write(
        src.join("graph/mod.rs"),
        "use crate::{ffi::a, session::Session};\n#[cfg(test)]\nmod tests { use crate::model; }\n",
    )
    .expect("write");
    let bad = violations(&src);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("`graph` (layer 5) names `session` (layer 11)"),
        "{bad:?}"
    );
    assert_eq!(
        module_cycle(&src),
        Some(vec!["graph".into(), "session".into(), "graph".into()])
    );
}

#[test]
fn the_checker_sees_a_circle_inside_a_folder() {
    // Two files of one folder naming each other (through `super::` and a group over two lines),
    // a third naming both from below: a circle the module-level check cannot see.
    let d = tempfile::tempdir().expect("tempdir");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("ffi")).expect("mkdir");
    std::fs::write(
        src.join("ffi/mod.rs"),
        "pub mod a;\npub mod b;\npub mod c;\n",
    )
    .expect("write");
    std::fs::write(src.join("ffi/a.rs"), "use super::b::Thing;\n").expect("write");
    std::fs::write(
        src.join("ffi/b.rs"),
        "use crate::ffi::{\n    c,\n    a::Other,\n};\n#[cfg(test)]\nmod tests { use super::super::c; }\n",
    )
    .expect("write");
    std::fs::write(src.join("ffi/c.rs"), "// super::a in a comment\n").expect("write");
    assert_eq!(module_cycle(&src), None);
    assert_eq!(
        file_cycle(&src),
        Some(vec!["ffi/a".into(), "ffi/b".into(), "ffi/a".into()])
    );
    let lines: Vec<(String, usize)> = references(&src)
        .into_iter()
        .filter(|r| r.from == ["ffi", "b"])
        .map(|r| (r.to.join("/"), r.line))
        .collect();
    assert_eq!(lines, [("ffi/c".to_string(), 2), ("ffi/a".to_string(), 3)]);
}
