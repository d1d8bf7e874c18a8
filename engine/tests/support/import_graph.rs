//! The import graph of a crate's `src`, file by file: which module each file is, and every module
//! its code names (`crate::`, `$crate::`, `super::`, `self::` paths and a file's own submodules,
//! `use` groups over several lines included). Test code (a file's `#[cfg(test)] mod tests`, and
//! files declared `#[cfg(test)] mod name;`) may name anything and is left out.
//!
//! Shared by both crates' layering tests (engine/tests/layering.rs and
//! runner/tests/cli/layering.rs, through `#[path]`): one checker, not two copies.
#![allow(dead_code)]
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`["ffi", "buffer"]`; the root is empty).
pub type Module = Vec<String>;

/// One module named by another file's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The file whose code names it.
    pub file: PathBuf,
    /// The line it is named on (from 1).
    pub line: usize,
    /// The naming file's module.
    pub from: Module,
    /// The module named: the longest path prefix that is a file of the crate (the root when a
    /// `crate::` path names no module, e.g. an item the root re-exports).
    pub to: Module,
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read a source folder") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// Whether a file's submodules live beside it (`mod.rs`, `lib.rs`, `main.rs`), not under a
/// folder of its name.
fn holds_folder(file: &Path) -> bool {
    matches!(
        file.file_stem().and_then(|s| s.to_str()),
        Some("mod" | "lib" | "main")
    )
}

/// The module a file of `src` is (`a/mod.rs` and `a.rs` are `a`; `lib.rs` is the root).
pub fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("a file under src");
    let mut m: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = m.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    match stem.as_str() {
        "mod" => {}
        "lib" | "main" if m.is_empty() => {}
        _ => m.push(stem),
    }
    m
}

/// The files that are test code as a whole: declared `#[cfg(test)] mod name;` by their parent.
pub fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).expect("read source");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        // A child of `a/mod.rs` or `lib.rs` lives beside it; a child of `a.rs` under `a/`.
        let parent = f.parent().expect("a file has a folder");
        let dir = match holds_folder(f) {
            true => parent.to_path_buf(),
            false => parent.join(f.file_stem().expect("a file name")),
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

/// The code of a file before its test module, without comment lines, as one string with the
/// byte offset where each line starts (a `use` group may span lines).
pub fn code_of(text: &str) -> (String, Vec<usize>) {
    let (mut code, mut starts) = (String::new(), Vec::new());
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        // A test module (always last in this code base) may use what it tests from anywhere.
        let next_is_inline_mod = lines
            .peek()
            .is_some_and(|l| l.trim_start().starts_with("mod ") && !l.trim_end().ends_with(';'));
        if t.starts_with("#[cfg(test)]") && next_is_inline_mod {
            break;
        }
        starts.push(code.len());
        if !t.starts_with("//") && !t.starts_with("#!") {
            code.push_str(line.split(" // ").next().unwrap_or(line));
        }
        code.push('\n');
    }
    (code, starts)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths of a path tree's text after a `::` (`a::b`, `{a, b::{c, d}}`, `*`), each as its
/// segments with the byte offset (in `s`) where it starts; stops where the tree ends.
fn path_tree(s: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let (mut prefix, mut i) = (Vec::<String>::new(), 0);
    let start = s.len() - s.trim_start().len();
    i += start;
    loop {
        let rest = &s[i..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0usize, i + 1);
            for (j, c) in group.char_indices() {
                let at = i + 1 + j;
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    ',' | '}' if depth == 0 => {
                        for (off, p) in path_tree(&s[item..at]) {
                            out.push((item + off, [prefix.clone(), p].concat()));
                        }
                        item = at + 1;
                        if c == '}' {
                            return out;
                        }
                    }
                    _ => {}
                }
            }
            return out;
        }
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() {
            break;
        }
        prefix.push(name.clone());
        i += name.len();
        match s[i..].strip_prefix("::") {
            Some(_) => i += 2,
            None => break,
        }
    }
    if !prefix.is_empty() {
        out.push((start, prefix));
    }
    out
}

/// Where a path that starts with `head` leads from module `from`; `None` for a name that is
/// neither a path keyword nor a submodule of `from` (a type, another crate).
fn base_of(head: &str, from: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    match head {
        "crate" | "$crate" => Some(Vec::new()),
        "self" => Some(from.clone()),
        "super" => Some(from[..from.len().saturating_sub(1)].to_vec()),
        _ => {
            let child = [from.clone(), vec![head.to_string()]].concat();
            modules.contains(&child).then_some(from.clone())
        }
    }
}

/// The longest prefix of `base` + `path` that is a module of the crate (`super::` steps up).
fn resolve(mut base: Module, path: &[String], modules: &BTreeSet<Module>) -> Module {
    let mut best = base.clone();
    for seg in path {
        if seg == "super" {
            base.pop();
            best = base.clone();
            continue;
        }
        base.push(seg.clone());
        if modules.contains(&base) {
            best = base.clone();
        }
    }
    best
}

/// Every module `code` (a file of module `from`) names, with its line.
fn named_in(
    code: &str,
    starts: &[usize],
    from: &Module,
    modules: &BTreeSet<Module>,
) -> Vec<(usize, Module)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find("::") {
        let sep = at + i;
        at = sep + 2;
        let before = &code[..sep];
        let head_start = before
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_ident(c) || c == '$')
            .last()
            .map_or(sep, |(j, _)| j);
        let head = &code[head_start..sep];
        let preceded_by_path = code[..head_start].trim_end().ends_with("::");
        if head.is_empty() || preceded_by_path {
            continue;
        }
        let Some(base) = base_of(head, from, modules) else {
            continue;
        };
        let first = if matches!(head, "crate" | "$crate" | "self" | "super") {
            Vec::new()
        } else {
            vec![head.to_string()]
        };
        for (off, p) in path_tree(&code[at..]) {
            let to = resolve(base.clone(), &[first.clone(), p].concat(), modules);
            let line = starts.partition_point(|&s| s <= at + off);
            out.push((line, to));
        }
    }
    out
}

/// Every reference from one file's code to another module (itself left out).
pub fn references(src: &Path) -> Vec<Reference> {
    let files = rust_files(src);
    let tests = test_only_files(&files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
    let mut out = Vec::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let from = module_of(src, f);
        let (code, starts) = code_of(&std::fs::read_to_string(f).expect("read source"));
        // `a::{b::X, c::Y}` names `a` once per line, not once per item.
        let named: BTreeSet<(usize, Module)> = named_in(&code, &starts, &from, &modules)
            .into_iter()
            .collect();
        for (line, to) in named.into_iter().filter(|(_, to)| *to != from) {
            let file = f.clone();
            out.push(Reference {
                file,
                line,
                from: from.clone(),
                to,
            });
        }
    }
    out
}

/// A cycle in a graph, if there is one, as the nodes around it (the first repeated at the end).
pub fn cycle_in(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            return Some([&path[i..], &[n.to_string()]].concat());
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
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

/// A cycle between the top-level modules (`ffi`, `config`), the crate root left out.
pub fn module_cycle(src: &Path) -> Option<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in references(src) {
        if let (Some(a), Some(b)) = (r.from.first(), r.to.first()) {
            if a != b {
                edges.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    cycle_in(&edges)
}

/// A cycle between files (`ffi/buffer` -> `ffi/registry` -> `ffi/buffer`), the crate root left
/// out: what a reader of one folder would walk in circles through. A file naming its own
/// folder's `mod.rs` (`super::Session`: the folder's type, whose methods the file holds, as Rust
/// splits a type over files) is not an edge; a `mod.rs` naming its files is.
pub fn file_cycle(src: &Path) -> Option<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in references(src) {
        let to_ancestor = r.from.starts_with(&r.to);
        if !r.from.is_empty() && !r.to.is_empty() && !to_ancestor {
            edges
                .entry(r.from.join("/"))
                .or_default()
                .insert(r.to.join("/"));
        }
    }
    cycle_in(&edges)
}

/// The references of `src` that break `layers` (top-level modules, lowest layer first: a module
/// names only modules of lower layers), as `file:line:` messages.
pub fn layer_violations(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let mut bad = Vec::new();
    for r in references(src) {
        let (Some(from), to) = (r.from.first(), r.to.first().map_or("crate", |s| s.as_str()))
        else {
            continue;
        };
        if from == to {
            continue;
        }
        let (file, line) = (r.file.display(), r.line);
        let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
            bad.push(format!(
                "{file}:{line}: `{from}` -> `{to}`: a module not on any layer, or the crate root \
                 (add a module to LAYERS there and to docs/architecture.md; nothing names the root)"
            ));
            continue;
        };
        if lt >= lf {
            bad.push(format!(
                "{file}:{line}: `{from}` (layer {lf}) names `{to}` (layer {lt}): imports must point \
                 to a lower layer"
            ));
        }
    }
    bad
}

/// How many references go between two files of one folder: a checker that sees none of them
/// (a parsing slip) would pass every circle test.
pub fn references_inside_folders(src: &Path) -> usize {
    references(src)
        .into_iter()
        .filter(|r| r.from.len() > 1 && r.to.len() > 1 && r.from[0] == r.to[0])
        .count()
}
