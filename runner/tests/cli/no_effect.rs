//! Settings without effect where they are set: one rule for the one-shot commands and
//! check/plan/run; a sweep of such a key is refused; an overlay written from a point carries
//! what the point depended on, so applying it reproduces the point.
use crate::common;

use common::{text, Project};

/// Seen red at be26907: `--set cache_mb=0,1` on a job that does not stream gave two identical
/// "points", `check` said ok and `run` measured noise between them.
#[test]
fn a_sweep_of_a_key_without_effect_is_refused() {
    let p = Project::with_examples();
    let o = p.bmoe(&[
        "check",
        "jobs/demo.toml",
        "--set",
        "cache_mb=0,1",
        "--no-probe",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("sweep points cache_mb=0 and cache_mb=1 of job demo on profile host-cpu resolve to the same configuration: cache_mb has no effect (moe_stream is false: nothing is streamed)"),
        "{out}"
    );
    assert!(out.contains("--allow-identical-points"), "{out}");
    let o = p.bmoe(&["run", "jobs/demo.toml", "--set", "cache_mb=0,1", "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!p.path("runs/demo.csv").exists(), "nothing is written");
    // Asked for: it runs, with the warning.
    let o = p.bmoe(&[
        "check",
        "jobs/demo.toml",
        "--set",
        "cache_mb=0,1",
        "--no-probe",
        "--allow-identical-points",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("warning: job demo: cache_mb (from --set) has no effect: moe_stream is false"),
        "{out}"
    );
    // Where the key acts, the sweep is two configurations.
    let o = p.bmoe(&[
        "check",
        "jobs/demo.toml",
        "--set",
        "moe_stream=true",
        "--set",
        "cache_mb=0,1",
        "--no-probe",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("has no effect"), "{}", text(&o));
}

/// The batch commands and the one-shot ones name the same keys: a lossy knob set without
/// streaming does nothing either way.
#[test]
fn one_rule_for_batch_and_one_shot_commands() {
    let p = Project::with_examples();
    let o = p.bmoe(&["plan", "jobs/demo.toml", "--set", "drop_cold=0.5"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(
            "warning: job demo: drop_cold (from --set) has no effect: moe_stream is false"
        ),
        "{out}"
    );
    let o = p.bmoe(&[
        "generate",
        "-m",
        "models/tiny.gguf",
        "-p",
        "Hi",
        "-n",
        "1",
        "--drop-cold",
        "0.5",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(
            "bmoe: --drop-cold has no effect (moe_stream is false: nothing is streamed): ignored"
        ),
        "{out}"
    );
}

/// Seen red at be26907: the overlay held only `cache_mb = 2`; applied to a job that does not
/// stream, the "tuned" run was the untuned one. The README's tuning loop, end to end.
#[test]
fn an_overlay_reproduces_its_point() {
    let p = Project::with_examples();
    let o = p.bmoe(&["run", "jobs/sweep-cache.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--best",
        "--objective",
        "read_mib_per_token",
        "--write-overrides",
        "best.toml",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let overlay = p.read("best.toml");
    assert!(overlay.contains("cache_mb = 2"), "{overlay}");
    assert!(overlay.contains("\nmoe_stream = true\n"), "{overlay}");
    for csv in ["runs/untuned.csv", "runs/tuned.csv"] {
        let mut args = vec![
            "run",
            "jobs/agent-replay.toml",
            "--limit",
            "2",
            "--csv",
            csv,
            "-q",
        ];
        if csv.ends_with("/tuned.csv") {
            args.extend(["--overrides", "best.toml"]);
        }
        let o = p.bmoe(&args);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = p.bmoe(&["compare", "runs/untuned.csv", "runs/tuned.csv"]);
    let out = text(&o);
    assert!(out.contains("moe_stream false -> true"), "{out}");
    assert!(out.contains("cache_mb 0 -> 2"), "{out}");
}
