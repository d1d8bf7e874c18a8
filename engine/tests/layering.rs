//! Imports run one way: every engine module sits on a layer and names only modules on layers
//! below it (`crate::` paths outside `#[cfg(test)]` code). A new module, or an import that points
//! up, fails here with the file, the line and the two layers. The layers are the ones
//! `docs/architecture.md` describes.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The engine's top-level modules, lowest layer first. A module may name modules of lower layers
/// only; modules on one layer do not name each other.
const LAYERS: &[&[&str]] = &[
    &["ffi"],
    &["error", "telemetry", "io"],
    &["limits", "chat"],
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

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read engine/src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src` belongs to (`None` for the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let m = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (m != "lib").then_some(m)
}

/// The modules a line names through `crate::` (`crate::a::b`, `crate::{a, b::c}`).
fn named_modules(line: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(ident).filter(|s| !s.is_empty()));
        } else {
            let m = ident(rest);
            if !m.is_empty() {
                out.push(m);
            }
        }
    }
    out
}

/// `(file, line number, from module, to module)` for every cross-module `crate::` reference in
/// code that is not a test module.
fn references(src: &Path) -> Vec<(PathBuf, usize, String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let Some(from) = module_of(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("read source");
        let mut lines = text.lines().enumerate().peekable();
        while let Some((i, line)) = lines.next() {
            let t = line.trim_start();
            // A test module (always last in this code base) may use what it tests from anywhere.
            if t.starts_with("#[cfg(test)]")
                && lines
                    .peek()
                    .is_some_and(|(_, l)| l.trim_start().starts_with("mod "))
            {
                break;
            }
            if t.starts_with("//") {
                continue;
            }
            for to in named_modules(line) {
                if to != from {
                    out.push((f.clone(), i + 1, from.clone(), to));
                }
            }
        }
    }
    out
}

/// The references that break the layering, as messages.
fn violations(src: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (file, line, from, to) in references(src) {
        let (Some(lf), Some(lt)) = (layer_of(&from), layer_of(&to)) else {
            bad.push(format!(
                "{}:{line}: `{from}` -> `{to}`: a module not on any layer (add it to LAYERS here \
                 and to docs/architecture.md)",
                file.display()
            ));
            continue;
        };
        if lt >= lf {
            bad.push(format!(
                "{}:{line}: `{from}` (layer {lf}) names `{to}` (layer {lt}): imports must point to \
                 a lower layer",
                file.display()
            ));
        }
    }
    bad
}

/// A cycle in the module graph, if there is one (independent of the layer table, so a wrong
/// table cannot hide one).
fn cycle(src: &Path) -> Option<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, _, from, to) in references(src) {
        edges.entry(from).or_default().insert(to);
    }
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, &edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
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
    if let Some(c) = cycle(&src_dir()) {
        panic!("import cycle between engine modules: {}", c.join(" -> "));
    }
}

#[test]
fn every_top_level_module_is_on_a_layer() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let missing: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(&src_dir(), f))
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
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files.sort();
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
        cycle(&src),
        Some(vec!["graph".into(), "session".into(), "graph".into()])
    );
}
