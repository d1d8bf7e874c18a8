//! Imports run one way in the runner too: every top-level module of `runner/src` sits on a layer
//! and names only modules on layers below it (`crate::` paths outside test code). A new module, or
//! an import that points up, fails here with the file, the line and the two layers. The layers
//! are the ones `docs/architecture.md` describes for the runner.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The runner's top-level modules, lowest layer first. A module may name modules of lower layers
/// only; modules on one layer do not name each other. The crate roots (`main.rs`, `lib.rs`) are above all.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["ident", "load_probe", "placement", "sink"],
    &["run", "compare", "merge"],
    &["report", "cli"],
    &["commands", "fuzzing"],
];

#[path = "../../../engine/tests/support/import_graph.rs"]
mod import_graph;

use import_graph::{file_cycle, module_cycle, references, rust_files};

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a file of `src` belongs to (`None` for the crate roots).
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
fn runner_modules_import_one_way() {
    let bad = violations(&src_dir());
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
    // The scan itself finds what it looks for: the commands name the layers below them.
    assert!(references(&src_dir()).len() > 20);
}

#[test]
fn runner_module_graph_has_no_cycle() {
    if let Some(c) = module_cycle(&src_dir()) {
        panic!("import cycle between runner modules: {}", c.join(" -> "));
    }
}

/// No circle between files either, inside a folder included (`config/job.rs` and
/// `config/jsonl.rs` named each other until the items got a file of their own).
#[test]
fn runner_files_import_without_a_circle() {
    if let Some(c) = file_cycle(&src_dir()) {
        panic!("import circle between runner files: {}", c.join(" -> "));
    }
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
        module_cycle(&src),
        Some(vec!["config".into(), "sink".into(), "config".into()])
    );
}

/// Where a subcommand's body lives: `commands/<name>.rs` or `commands/<name>/mod.rs`, the name
/// with `-` as `_`. `completions` prints what `man` prints, from the same clap tree.
fn command_home(src: &Path, name: &str) -> Option<PathBuf> {
    let name = match name {
        "completions" => "man",
        n => n,
    }
    .replace('-', "_");
    let dir = src.join("commands");
    [
        dir.join(format!("{name}.rs")),
        dir.join(&name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

#[test]
fn every_subcommand_has_its_own_file_in_commands() {
    use clap::CommandFactory;
    let src = src_dir();
    let cli = bmoe_runner::cli::Cli::command();
    let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
    assert!(names.len() >= 15, "too few subcommands seen: {names:?}");
    let homeless: Vec<&&str> = names
        .iter()
        .filter(|n| command_home(&src, n).is_none())
        .collect();
    assert!(
        homeless.is_empty(),
        "subcommands without commands/<name>.rs or commands/<name>/mod.rs: {homeless:?}"
    );
    // The check can fail: a name with no file is homeless.
    assert!(command_home(&src, "no-such-command").is_none());
}
