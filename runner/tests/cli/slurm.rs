//! deploy/slurm on a real scheduler: scripts/test-slurm starts a one-node Slurm here (munged,
//! slurmctld, slurmd on localhost, 2 CPUs), submits the nightly replay with deploy/slurm/submit.sh
//! as an array of 4 tasks, stops one task with SIGTERM in the middle of its shard (it requeues
//! itself and resumes), and lets the merge job run after the array. This test then holds the merged
//! CSV against one process's run of the same job: every item exactly once, the same results.
//!
//! Slurm is required: where it is not installed (scripts/setup --deps-only installs it) or this is
//! not root, the test fails. Outside CI, `TEST_SLURM=skip` skips it instead.
use crate::common;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{csv_rows, text, Project, DECIDE_JOB};

/// Items in the job: about 30 a shard, so a SIGTERM after a shard's first row lands with rows to
/// go. With 12 a shard the run under the full suite's load once finished its shard in the 3 s the
/// script gives `scancel` (Slurm answered "try again later"), and the task ended COMPLETED.
const N: usize = 120;

/// The columns that are a row's result (what `bmoe merge` calls a conflict when they differ).
const RESULT: [&str; 9] = [
    "kind",
    "model_hash",
    "n_prompt",
    "tokens",
    "best",
    "choice_logp",
    "n_scored",
    "error",
    "text",
];

/// Why Slurm cannot run here, if it cannot.
fn missing() -> Option<String> {
    for d in ["munged", "slurmctld", "slurmd"] {
        if !Path::new("/usr/sbin").join(d).exists() {
            return Some(format!("/usr/sbin/{d} is missing: install the Debian packages slurm-wlm and munge (scripts/setup --deps-only)"));
        }
    }
    let uid = Command::new("id").arg("-u").output().ok()?;
    (String::from_utf8_lossy(&uid.stdout).trim() != "0")
        .then(|| "the test starts slurmctld and slurmd as root; run it as root".to_string())
}

/// Rows of a CSV by item id, each row as column -> value (the item's rows in file order).
fn rows_by_item(path: &Path) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let csv = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut by_item: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for row in csv_rows(&csv) {
        by_item.entry(row["item"].clone()).or_default().push(row);
    }
    by_item
}

#[test]
fn nightly_replay_on_a_real_slurm_survives_sigterm_and_requeue_and_merges_equal() {
    if let Some(why) = missing() {
        if std::env::var_os("CI").is_none() && std::env::var("TEST_SLURM").as_deref() == Ok("skip")
        {
            eprintln!("slurm test skipped (TEST_SLURM=skip): {why}");
            return;
        }
        panic!("the Slurm test cannot run: {why}; outside CI, TEST_SLURM=skip skips it");
    }
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);

    let mut c = Command::new("bash");
    c.arg(common::repo_root().join("scripts/test-slurm"))
        .arg(env!("CARGO_BIN_EXE_bmoe"))
        .arg(p.path(""))
        .arg("4");
    // Nothing of the shell running the tests reaches the jobs (sbatch --export=ALL): no bmoe
    // settings, no scheduler variables of an enclosing Slurm job.
    common::clean_env(&mut c);
    for (k, _) in std::env::vars() {
        if k.starts_with("SLURM_") || k.starts_with("SBATCH_") || k.starts_with("REPLAY_") {
            c.env_remove(k);
        }
    }
    let o = c.output().unwrap();
    let out = text(&o);
    eprintln!("{out}");
    assert!(o.status.success(), "scripts/test-slurm failed:\n{out}");

    let o = p.bmoe(&["run", "jobs/job.toml", "--csv", "runs/one.csv", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let fleet = rows_by_item(&p.path("runs/slurm/all.csv"));
    let one = rows_by_item(&p.path("runs/one.csv"));
    let ids: Vec<String> = (1..=N).map(|i| format!("d{i}")).collect();
    assert!(
        fleet.keys().eq(one.keys()) && one.len() == N,
        "the fleet and one process ran different items: {:?} vs {:?}",
        fleet.keys(),
        one.keys()
    );
    for id in &ids {
        let rows = &fleet[id];
        assert_eq!(
            rows.len(),
            1,
            "item {id} is in the merged CSV {} times",
            rows.len()
        );
        let (f, o) = (&rows[0], &one[id][0]);
        for col in RESULT {
            assert_eq!(
                f[col], o[col],
                "item {id}: `{col}` differs between the fleet and one process"
            );
        }
        assert!(!f["best"].is_empty(), "item {id} has no chosen answer");
    }
    // bmoe's own comparison agrees: no row differs, none is in one run only.
    let o = p.bmoe(&["compare", "runs/one.csv", "runs/slurm/all.csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
