//! In-process entry points for coverage-guided fuzzing (`fuzz/`, `cargo fuzz`) and for replaying
//! its corpus in the ordinary test suite (`tests/cli/fuzz_corpus.rs`): each hands any bytes to one
//! of the readers of what users write (profiles, jobs, JSONL items, telemetry CSV) as a file, and
//! renders every error as the CLI would (text and `--format json`). An error is an answer; a panic
//! is a finding.
use std::path::PathBuf;

use crate::config::diag::ConfigErrors;
use crate::config::item::Kind;
use crate::config::job::load_job;
use crate::config::jsonl::read_items;
use crate::config::profile::load_profile;
use crate::sink::read;

/// A folder of its own for each process and thread, rewritten for each case: a job names other
/// files relative to itself, so it must not find a previous case's.
fn case_dir() -> PathBuf {
    let tid = format!("{:?}", std::thread::current().id());
    let tid: String = tid.chars().filter(char::is_ascii_digit).collect();
    let base = ["/dev/shm", "/run/shm"]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("bmoe-fuzz-runner-{}-{tid}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the fuzz case folder can be made");
    dir
}

fn case_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = case_dir().join(name);
    std::fs::write(&path, bytes).expect("the fuzz case file can be written");
    path
}

/// Renders the errors both ways the CLI prints them.
fn render(e: &ConfigErrors) {
    let _ = e.to_string();
    let _ = e.json().to_string();
}

/// A device profile (`bmoe check profile.toml`).
pub fn profile(bytes: &[u8]) {
    if let Err(e) = load_profile(&case_file("profile.toml", bytes)) {
        render(&e);
    }
}

/// A job file; the files it names resolve beside it, in an otherwise empty folder.
pub fn job(bytes: &[u8]) {
    if let Err(e) = load_job(&case_file("job.toml", bytes)) {
        render(&e);
    }
}

/// A JSONL item file, read as each kind of job reads it.
pub fn jsonl(bytes: &[u8]) {
    let path = case_file("items.jsonl", bytes);
    for kind in [Kind::Generate, Kind::Decide, Kind::Perplexity] {
        match read_items(&path, kind) {
            Ok(items) => {
                for d in &items.errors {
                    let _ = d.to_string();
                    let _ = d.json();
                }
            }
            Err(Some(e)) => render(&e),
            Err(None) => {}
        }
    }
}

/// A telemetry CSV as `report` and `compare` read it (the shared reader, then each command's
/// typed rows).
pub fn csv(bytes: &[u8]) {
    let path = case_file("runs.csv", bytes);
    match read::parse(&path, bytes) {
        Ok(table) => {
            let _ = read::check_identity(&path, &table.header);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Err(e) = crate::compare::input::load(&path, None) {
        let _ = format!("{e:#}");
    }
    let mut data = crate::report::input::Data::default();
    if let Err(e) = data.add_file(&path) {
        let _ = e.to_string();
    }
}
