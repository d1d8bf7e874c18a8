//! The examples in deploy/: the manifests parse and agree with themselves (shard counts, run ids),
//! and the container entrypoint and the Slurm scripts run here with the schedulers' variables set
//! by hand, end to end: shards, SIGTERM and resume, merge, comparison.
use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{data_lines, text, Project, DECIDE_JOB};
use yaml_rust2::{Yaml, YamlLoader};

fn deploy(rel: &str) -> PathBuf {
    common::repo_root().join("deploy").join(rel)
}

fn load(rel: &str) -> Vec<Yaml> {
    let t = std::fs::read_to_string(deploy(rel)).unwrap();
    YamlLoader::load_from_str(&t).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The value of env var `name` in a container spec.
fn env_of<'a>(container: &'a Yaml, name: &str) -> Option<&'a str> {
    container["env"]
        .as_vec()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))?["value"]
        .as_str()
}

#[test]
fn manifests_parse_and_agree() {
    let docs = load("k8s/nightly-replay.yaml");
    let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["PersistentVolumeClaim", "Job", "Job"]);
    let job = &docs[1]["spec"];
    assert_eq!(job["completionMode"].as_str(), Some("Indexed"));
    let n = job["completions"].as_i64().unwrap();
    assert_eq!(job["parallelism"].as_i64(), Some(n));
    let c = &job["template"]["spec"]["containers"][0];
    assert_eq!(env_of(c, "REPLAY_SHARDS"), Some(n.to_string().as_str()));
    let run_id = env_of(c, "REPLAY_RUN_ID").unwrap();
    let merge = &docs[2]["spec"]["template"]["spec"];
    assert_eq!(
        env_of(&merge["containers"][0], "REPLAY_RUN_ID"),
        Some(run_id)
    );
    let wait = merge["initContainers"][0]["command"][2].as_str().unwrap();
    assert!(
        wait.contains(&format!("/runs/{run_id}/shard-*.json")),
        "{wait}"
    );
    assert!(wait.contains(&format!("-ge {n}")), "{wait}");

    let wf = &load("ci/nightly-replay.yml")[0];
    let shards = wf["jobs"]["replay"]["strategy"]["matrix"]["shard"]
        .as_vec()
        .unwrap();
    let steps = wf["jobs"]["replay"]["steps"].as_vec().unwrap();
    let shard_env = steps
        .iter()
        .find_map(|s| s["env"]["REPLAY_SHARD"].as_str())
        .unwrap();
    assert_eq!(
        shard_env,
        format!("${{{{ matrix.shard }}}}/{}", shards.len())
    );
    assert_eq!(
        wf["jobs"]["merge"]["needs"].as_str(),
        Some("replay"),
        "the merge runs after every shard"
    );
}

/// `bash script [mode]` in the project, with only the variables given (plus PATH and HOME).
fn script(p: &Project, script: &Path, mode: Option<&str>, vars: &[(&str, &str)]) -> Command {
    let mut c = Command::new("bash");
    c.arg(script)
        .args(mode)
        .current_dir(p.path(""))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("XDG_CACHE_HOME", p.path(".cache"))
        .env("REPLAY_BIN", env!("CARGO_BIN_EXE_bmoe"))
        .env("REPLAY_JOB", "jobs/job.toml")
        .env("REPLAY_OUT", "runs")
        .env("REPLAY_RUN_ID", "nightly");
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn ok(o: Output) -> String {
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    t
}

#[test]
fn entrypoint_runs_shards_stops_on_sigterm_resumes_and_merges() {
    const N: usize = 30;
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);
    let ep = deploy("entrypoint.sh");

    // Shard 0 is evicted part way: SIGTERM to the entrypoint, which passes it on.
    let child = script(
        &p,
        &ep,
        Some("run"),
        &[("JOB_COMPLETION_INDEX", "0"), ("REPLAY_SHARDS", "3")],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let t0 = Instant::now();
    while data_lines(&p.read("runs/nightly/shard-0.csv")).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no rows");
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let stopped = data_lines(&p.read("runs/nightly/shard-0.csv")).len();
    eprintln!("shard 0: exit {:?} after {stopped} rows", o.status.code());
    // When the shard was already done (it is small), the stop changes nothing; otherwise it is a
    // clean stop (130) without the done marker.
    if o.status.code() == Some(130) {
        assert!(!p.path("runs/nightly/shard-0.json").exists());
        assert!(
            text(&o).contains("--resume --run-id nightly"),
            "{}",
            text(&o)
        );
    } else {
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }

    // The restarted pod resumes; the other two shards run.
    for k in 0..3 {
        let out = ok(script(
            &p,
            &ep,
            Some("run"),
            &[
                ("JOB_COMPLETION_INDEX", &k.to_string()),
                ("REPLAY_SHARDS", "3"),
            ],
        )
        .output()
        .unwrap());
        assert!(out.contains("\"run_id\": \"nightly\""), "{out}");
        let summary = p.read(&format!("runs/nightly/shard-{k}.json"));
        assert!(
            summary.contains(&format!("\"shard\": \"{k}/3\"")),
            "{summary}"
        );
        if k == 0 {
            assert!(out.contains(&format!("\"skipped\": {stopped}")), "{out}");
        }
    }
    let out = ok(script(&p, &ep, Some("merge"), &[]).output().unwrap());
    assert!(
        out.contains(&format!("{N} rows written to runs/nightly/all.csv")),
        "{out}"
    );
    assert_eq!(data_lines(&p.read("runs/nightly/all.csv")).len(), N);

    // With a baseline: identical -> 0 (a copy under another run id: the merged file itself is the
    // same run, which compares nothing, exit 2); a different baseline -> 1 (the runs differ).
    p.write(
        "runs/same.csv",
        &p.read("runs/nightly/all.csv")
            .replace("\nnightly,", "\nlast-night,"),
    );
    let out = ok(script(
        &p,
        &ep,
        Some("merge"),
        &[("REPLAY_BASELINE", "runs/same.csv")],
    )
    .output()
    .unwrap());
    assert!(
        out.contains(&format!("result: all {N} rows identical")),
        "{out}"
    );
    let fewer: String = p
        .read("runs/nightly/all.csv")
        .lines()
        .take(N)
        .map(|l| format!("{l}\n"))
        .collect();
    p.write("runs/baseline.csv", &fewer);
    let o = script(
        &p,
        &ep,
        Some("merge"),
        &[("REPLAY_BASELINE", "runs/baseline.csv")],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

#[test]
fn slurm_array_scripts_run_with_the_variables_set_by_hand() {
    const N: usize = 12;
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);
    let dep = common::repo_root().join("deploy");
    let dep = dep.to_str().unwrap();
    // A 1-based array (--array=1-3): bmoe shards by TASK_ID - TASK_MIN.
    for id in 1..=3 {
        ok(script(
            &p,
            &deploy("slurm/nightly-replay.sbatch"),
            None,
            &[
                ("SLURM_ARRAY_TASK_ID", &id.to_string()),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
                ("REPLAY_DEPLOY", dep),
            ],
        )
        .output()
        .unwrap());
    }
    for k in 0..3 {
        assert!(p.path(&format!("runs/nightly/shard-{k}.json")).exists());
    }
    let out = ok(script(
        &p,
        &deploy("slurm/merge.sbatch"),
        None,
        &[("REPLAY_DEPLOY", dep)],
    )
    .output()
    .unwrap());
    assert!(out.contains(&format!("{N} rows written")), "{out}");
    // Outside an array the task script refuses to guess.
    let o = script(&p, &deploy("slurm/nightly-replay.sbatch"), None, &[])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("run as a Slurm array task"),
        "{}",
        text(&o)
    );
}
