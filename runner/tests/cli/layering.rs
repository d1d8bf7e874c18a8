//! Imports run one way in the runner too: every top-level module of `runner/src` sits on a layer
//! and names only modules on layers below it (`crate::` paths outside test code). A new module, or
//! an import that points up, fails here with the file, the line and the two layers. The layers
//! are the ones `docs/architecture.md` describes for the runner.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The runner's top-level modules, lowest layer first. A module may name modules of lower layers
/// only; modules on one layer do not name each other. The crate roots (`main.rs`, `lib.rs`) are above all.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["ident", "placement", "probe", "sink"],
    &["schema", "run", "direct", "compare", "merge", "measure"],
    &["report", "cli"],
    &["commands", "fuzzing"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read runner/src") {
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
    (m != "main" && m != "lib").then_some(m)
}

/// The files that are test code as a whole: declared `#[cfg(test)] mod name;` by their parent.
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).expect("read source");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        // A child of `a/mod.rs` or `main.rs` lives beside it; a child of `a.rs` under `a/`.
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let parent = f.parent().expect("a file has a folder");
        let dir = if stem == "mod" || stem == "main" || stem == "lib" {
            parent.to_path_buf()
        } else {
            parent.join(stem)
        };
        for w in lines.windows(2) {
            let decl = w[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';'));
            if let (true, Some(name)) = (w[0].starts_with("#[cfg(test)]"), decl) {
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// The leading identifier of `s`.
fn ident(s: &str) -> String {
    s.trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level items of a `{...}` group (its text after the brace), split at the commas that
/// are not nested in an inner group, each with its byte offset in `group`.
fn group_items(group: &str) -> Vec<(usize, String)> {
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    let mut end = group.len();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                end = i;
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push((start, &group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push((start, &group[start..end]));
    out.into_iter()
        .map(|(at, item)| (at + item.len() - item.trim_start().len(), ident(item)))
        .filter(|(_, name)| !name.is_empty())
        .collect()
}

/// The code of a file before its test module, without comment lines, as one string with the
/// byte offset where each line starts (a `use crate::{...}` group may span lines).
fn code_of(text: &str) -> (String, Vec<usize>) {
    let (mut code, mut starts) = (String::new(), Vec::new());
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        // A test module (always last in this code base) may use what it tests from anywhere.
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with("mod ") && !l.trim_end().ends_with(';'))
        {
            break;
        }
        starts.push(code.len());
        if !t.starts_with("//") {
            code.push_str(line);
        }
        code.push('\n');
    }
    (code, starts)
}

/// `(line number, module)` for every module that `code` names through `crate::` (`crate::a::b`,
/// `crate::{a, b::{c, d}}`, over several lines).
fn named_modules(code: &str, starts: &[usize]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find("crate::") {
        let pos = at + i;
        at = pos + "crate::".len();
        let rest = &code[at..];
        let names = match rest.strip_prefix('{') {
            Some(group) => group_items(group)
                .into_iter()
                .map(|(off, n)| (at + 1 + off, n))
                .collect(),
            None => vec![(at, ident(rest))],
        };
        for (p, n) in names.into_iter().filter(|(_, n)| !n.is_empty()) {
            out.push((starts.partition_point(|&s| s <= p), n));
        }
    }
    out
}

/// `(file, line number, from module, to module)` for every cross-module `crate::` reference in
/// code that is not test code.
fn references(src: &Path) -> Vec<(PathBuf, usize, String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let tests = test_only_files(&files);
    let mut out = Vec::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let Some(from) = module_of(src, f) else {
            continue;
        };
        let (code, starts) = code_of(&std::fs::read_to_string(f).expect("read source"));
        for (line, to) in named_modules(&code, &starts) {
            if to != from {
                out.push((f.clone(), line, from.clone(), to));
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
                "{}:{line}: `{from}` -> `{to}`: a module not on any layer, or the crate root \
                 (add a module to LAYERS here and to docs/architecture.md; nothing names main.rs)",
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
fn runner_modules_import_one_way() {
    let bad = violations(&src_dir());
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
    // The scan itself finds what it looks for: the commands name the layers below them.
    assert!(references(&src_dir()).len() > 20);
}

#[test]
fn runner_module_graph_has_no_cycle() {
    if let Some(c) = cycle(&src_dir()) {
        panic!("import cycle between runner modules: {}", c.join(" -> "));
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

#[test]
fn the_checker_sees_an_upward_import() {
    // A scratch tree where `config` names `sink` over a multi-line group, with test code that may
    // name anything.
    let d = tempfile::tempdir().expect("tempdir");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("config")).expect("mkdir");
    std::fs::write(src.join("sink.rs"), "use crate::config::diag;\n").expect("write");
    std::fs::write(
        src.join("config/mod.rs"),
        "#[cfg(test)]\nmod agreement;\n// crate::commands in a comment\nuse crate::{\n    \
         config::x,\n    sink::{row::Row, csv},\n};\n#[cfg(test)]\nmod tests { use crate::commands; }\n",
    )
    .expect("write");
    std::fs::write(src.join("config/agreement.rs"), "use crate::Cli;\n").expect("write");
    let bad = violations(&src);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("config/mod.rs:6: `config` (layer 0) names `sink` (layer 1)"),
        "{bad:?}"
    );
    assert_eq!(
        cycle(&src),
        Some(vec!["config".into(), "sink".into(), "config".into()])
    );
}
