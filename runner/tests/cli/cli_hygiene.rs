//! What every command owes a shell: a quiet end when the reader of stdout goes away, a version
//! that names the build, no internal command in completions or man pages, and a run summary that
//! says what each kind of job measured.
use crate::common;
use std::process::Stdio;

use common::{text, Project, DECIDE_JOB};

/// Runs `bmoe` with its stdout closed before it writes: the first write meets EPIPE.
fn with_closed_stdout(p: &Project, args: &[&str]) -> (Option<i32>, String) {
    let mut c = p.cmd(args);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let p = Project::new();
    p.write("jobs/decide.toml", DECIDE_JOB);
    p.decisions("jobs/decisions.jsonl", 3);
    for args in [
        &["plan", "jobs/decide.toml"][..],
        &["man"][..],
        &["completions", "bash"][..],
        &["check", "jobs/decide.toml", "--no-probe"][..],
    ] {
        let (code, err) = with_closed_stdout(&p, args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
    // A run cut short by its reader is not a success: --machine lines go to stdout.
    let (code, err) = with_closed_stdout(&p, &["run", "jobs/decide.toml", "--machine", "-q"]);
    assert_eq!(code, Some(130), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn version_names_the_commit_the_llama_cpp_pin_and_the_backends() {
    let o = common::bmoe_command().arg("--version").output().unwrap();
    assert!(o.status.success());
    let v = String::from_utf8_lossy(&o.stdout);
    for want in [
        "commit: ",
        "llama.cpp: llama-cpp-sys-2 ",
        "backends: ",
        "CPU",
    ] {
        assert!(v.contains(want), "{want}: {v}");
    }
}

#[test]
fn the_probe_child_is_in_no_completion_or_man_page() {
    let p = Project::new();
    let o = p.bmoe(&["completions", "bash"]);
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stdout).contains("__probe"));
    let o = p.bmoe(&["man", "--out", "man"]);
    assert!(o.status.success(), "{}", text(&o));
    let pages: Vec<String> = std::fs::read_dir(p.path("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(pages.iter().any(|n| n == "bmoe-run.1"), "{pages:?}");
    assert!(!pages.iter().any(|n| n.contains("probe")), "{pages:?}");
    let run = p.read("man/bmoe-run.1");
    assert!(run.contains("bmoe run"), "{run}");
    assert!(
        !run.contains("bmoe-run \\-"),
        "the page is titled `bmoe run`"
    );
}

#[test]
fn run_summaries_say_what_each_kind_measured() {
    let p = Project::new();
    p.write(
        "jobs/ppl.toml",
        r#"
name = "ppl"
model = "../models/tiny.gguf"
kind = "perplexity"
profile = "../profiles/host.toml"
csv = "../runs/ppl.csv"
prompts = [{ id = "fox", text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog." }]
"#,
    );
    p.write(
        "jobs/gen.toml",
        r#"
name = "gen"
model = "../models/tiny.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/gen.csv"
prompts = ["Hello", "Once upon a time"]
n_predict = 8
"#,
    );
    let o = p.bmoe(&["run", "jobs/ppl.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("1 row appended"), "{out}");
    assert!(
        out.contains("perplexity: ") && out.contains(" +/- ") && out.contains("scored tokens"),
        "{out}"
    );
    assert!(
        !out.contains("skipped"),
        "nothing skipped, nothing said: {out}"
    );
    let o = p.bmoe(&["run", "jobs/gen.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 rows appended"), "{out}");
    assert!(out.contains("decode: ") && out.contains("tok/s"), "{out}");
}

#[test]
fn written_reports_follow_the_umask() {
    let p = Project::new();
    p.write("jobs/decide.toml", DECIDE_JOB);
    p.decisions("jobs/decisions.jsonl", 2);
    assert!(p.bmoe(&["run", "jobs/decide.toml", "-q"]).status.success());
    let o = p
        .cmd(&["report", "runs/decide.csv", "-o", "r.md"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p.path("r.md"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    // The tests run under the harness's umask; the file must be 0666 less it.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .unwrap();
    assert_eq!(mode, 0o666 & !umask);
}

#[test]
fn errors_are_coloured_on_a_terminal_unless_no_color() {
    let p = Project::new();
    p.write("jobs/bad.toml", "name = \"bad\"\nmodle = 1\n");
    let bin = env!("CARGO_BIN_EXE_bmoe");
    // `script` gives the command a pseudo-terminal, as a person's shell would.
    let on_tty = |no_color: bool| {
        let mut c = std::process::Command::new("script");
        common::clean_env(&mut c);
        if no_color {
            c.env("NO_COLOR", "1");
        } else {
            c.env_remove("NO_COLOR");
        }
        let o = c
            .args(["-qec", &format!("{bin} check jobs/bad.toml"), "/dev/null"])
            .current_dir(p.path(""))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let coloured = on_tty(false);
    assert!(
        coloured.contains("\x1b[1;31merror\x1b[0m: "),
        "{coloured:?}"
    );
    let plain = on_tty(true);
    assert!(
        plain.contains("error: ") && !plain.contains("\x1b[1;31m"),
        "{plain:?}"
    );
    // Off a terminal: plain.
    let o = p.bmoe(&["check", "jobs/bad.toml"]);
    assert!(!text(&o).contains('\x1b'), "{}", text(&o));
}

#[test]
fn one_spelling_for_output_and_format_with_the_old_ones_as_aliases() {
    let p = Project::new();
    for args in [
        &["devices", "--format", "json"][..],
        &["devices", "--json"][..],
        &["archs", "--format", "json"][..],
    ] {
        let o = p.bmoe(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert!(v.is_object() || v.is_array(), "{args:?}");
    }
    let o = p.bmoe(&[
        "generate",
        "-m",
        "models/tiny.gguf",
        "-p",
        "Hi",
        "-n",
        "2",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("a JSON record");
    for (flag, dir) in [("-o", "m1"), ("--output", "m2"), ("--out", "m3")] {
        let o = p.bmoe(&["man", flag, dir]);
        assert!(o.status.success(), "{flag}: {}", text(&o));
        assert!(p.path(&format!("{dir}/bmoe.1")).exists(), "{flag}");
    }
    for (flag, dir) in [("--output", "s1"), ("--out", "s2")] {
        let o = p.bmoe(&["schema", flag, dir]);
        assert!(o.status.success(), "{flag}: {}", text(&o));
        assert!(p.path(&format!("{dir}/job.schema.json")).exists(), "{flag}");
    }
}

#[test]
fn every_batch_command_shows_examples_in_its_help() {
    for cmd in [
        "check", "plan", "run", "compare", "merge", "report", "generate", "decide", "ppl", "synth",
    ] {
        let o = common::bmoe_command()
            .args([cmd, "--help"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{cmd}");
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(help.contains("Examples:\n  bmoe "), "{cmd}: {help}");
    }
}

#[test]
fn a_single_choice_is_named_as_no_decision() {
    let p = Project::new();
    let o = p.bmoe(&[
        "decide",
        "-m",
        "models/tiny.gguf",
        "--prefix",
        "Go?",
        "--choice",
        "yes",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("bmoe: one choice is always the best"),
        "{}",
        text(&o)
    );
}

/// The JSON printers end as quietly as the text ones when stdout's reader has gone
/// (`bmoe plan --format json | head -1`).
#[test]
fn json_printers_end_quietly_on_a_closed_stdout() {
    let p = Project::new();
    p.write("jobs/decide.toml", DECIDE_JOB);
    p.decisions("jobs/decisions.jsonl", 2);
    for csv in ["runs/a.csv", "runs/b.csv"] {
        let o = p.bmoe(&["run", "jobs/decide.toml", "-q", "--csv", csv]);
        assert!(o.status.success(), "{}", text(&o));
    }
    for args in [
        &["plan", "jobs/decide.toml", "--format", "json"][..],
        &["compare", "runs/a.csv", "runs/b.csv", "--format", "json"][..],
        &[
            "merge",
            "runs/a.csv",
            "-o",
            "runs/all.csv",
            "--format",
            "json",
        ][..],
    ] {
        let (code, err) = with_closed_stdout(&p, args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}
