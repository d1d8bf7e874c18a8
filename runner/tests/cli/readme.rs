//! The README's examples run as written, so they cannot drift from the tool: every line of every
//! ```sh block, in order, in one scratch copy of the repository's jobs/ and profiles/ beside the
//! tiny model, through bash with `bmoe` on PATH. A line's exit status must be 0, or N when its
//! comment ends with `(exit N)`.
use crate::common;
use std::path::Path;
use std::process::Command;

/// One command of a ```sh block.
#[derive(Debug)]
struct Example {
    /// The README line it starts on (1-based).
    line: usize,
    /// The command, continuation lines joined.
    cmd: String,
    /// The exit status it must end with.
    exit: i32,
}

/// The expected exit status named by a trailing `(exit N)` in the line's comment.
fn expected_exit(line: &str) -> i32 {
    let Some((_, comment)) = line.split_once(" # ") else {
        return 0;
    };
    comment
        .trim_end()
        .strip_suffix(')')
        .and_then(|c| c.rsplit_once("(exit "))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// Every command of every ```sh block of `md`.
fn examples(md: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<Example> = None;
    for (i, raw) in md.lines().enumerate() {
        let t = raw.trim_end();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let (body, more) = match t.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (t, false),
        };
        let ex = match pending.take() {
            Some(mut e) => {
                e.cmd.push(' ');
                e.cmd.push_str(body.trim());
                e.exit = expected_exit(t);
                e
            }
            None if body.trim().is_empty() || body.trim_start().starts_with('#') => continue,
            None => Example {
                line: i + 1,
                cmd: body.to_string(),
                exit: expected_exit(t),
            },
        };
        if more {
            pending = Some(ex);
        } else {
            out.push(ex);
        }
    }
    out
}

/// Copies a folder's files (not recursively).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_parser_reads_continuations_and_exit_marks() {
    let md = "text\n```sh\nbmoe a   # one\nbmoe b \\\n    --x   # two (exit 2)\n# a comment\n```\n```\nbmoe not-run\n```\n";
    let ex = examples(md);
    assert_eq!(ex.len(), 2, "{ex:?}");
    assert_eq!((ex[0].line, ex[0].exit), (3, 0));
    assert_eq!(
        ex[1].cmd.split_whitespace().take(3).collect::<Vec<_>>(),
        ["bmoe", "b", "--x"]
    );
    assert_eq!(ex[1].exit, 2);
}

#[test]
fn every_readme_example_runs_with_the_exit_status_it_says() {
    let root = common::repo_root();
    let md = std::fs::read_to_string(root.join("README.md")).unwrap();
    let ex = examples(&md);
    // A README whose examples are not in ```sh blocks would pass vacuously.
    assert!(ex.len() >= 20, "only {} examples found", ex.len());
    let p = common::Project::new();
    copy_dir(&root.join("jobs"), &p.path("jobs"));
    copy_dir(&root.join("profiles"), &p.path("profiles"));
    let bin = Path::new(env!("CARGO_BIN_EXE_bmoe"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut failed = Vec::new();
    for e in &ex {
        let mut c = Command::new("bash");
        common::clean_env(&mut c);
        let o = c
            .args(["-c", &format!("set -o pipefail; {}", e.cmd)])
            .current_dir(p.path(""))
            .env("PATH", &path)
            .env("XDG_CACHE_HOME", p.path(".cache"))
            .output()
            .unwrap();
        let code = o.status.code().unwrap_or(-1);
        if code != e.exit {
            failed.push(format!(
                "README.md:{}: `{}` exited {code}, the README says {}\n{}",
                e.line,
                e.cmd,
                e.exit,
                common::text(&o)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
