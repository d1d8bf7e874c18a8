//! `shard_by`: a decide job shards its decisions by a group named in their `meta` (an episode),
//! so each episode runs whole in one shard, in file order; without it, by item id as before.
use crate::common;

use common::{csv_rows, text, Project, DECIDE_JOB};

/// Four episodes of three steps, interleaved in the file (e0 e1 e2 e3 e0 ...), ids s1..s12.
fn episodes(p: &Project, missing_at: Option<usize>) {
    let mut s = String::new();
    for i in 1..=12 {
        let meta = if missing_at == Some(i) {
            "{\"step\": 1}".to_string()
        } else {
            format!("{{\"episode\": \"e{}\"}}", (i - 1) % 4)
        };
        s.push_str(&format!(
            "{{\"id\": \"s{i}\", \"prefix\": \"Episode {}: history.\\n\", \"suffix\": \"Step {i}\", \"choices\": [\"OK\", \"Cancel\"], \"meta\": {meta}}}\n",
            (i - 1) % 4
        ));
    }
    p.write("jobs/decisions.jsonl", &s);
}

/// The item ids of a CSV, in row order.
fn items(csv: &str) -> Vec<String> {
    csv_rows(csv)
        .into_iter()
        .map(|r| r["item"].clone())
        .collect()
}

fn episode_of(id: &str) -> usize {
    (id[1..].parse::<usize>().unwrap() - 1) % 4
}

/// Runs shards 0/2 and 1/2; returns each shard's item ids in row order.
fn run_shards(p: &Project) -> Vec<Vec<String>> {
    (0..2)
        .map(|k| {
            let csv = format!("runs/shard-{k}.csv");
            let o = p.bmoe(&[
                "run",
                "jobs/job.toml",
                "--shard",
                &format!("{k}/2"),
                "--csv",
                &csv,
                "--allow-empty",
                "--quiet",
            ]);
            assert!(o.status.success(), "shard {k}: {}", text(&o));
            items(&p.read(&csv))
        })
        .collect()
}

#[test]
fn episodes_stay_whole_in_one_shard_in_file_order() {
    let p = Project::new();
    episodes(&p, None);

    // Without shard_by: by item id, as before; this split puts an episode on both shards.
    p.write("jobs/job.toml", DECIDE_JOB);
    let by_id = run_shards(&p);
    let split = (0..4).any(|e| by_id.iter().all(|s| s.iter().any(|id| episode_of(id) == e)));
    assert!(split, "by id no episode is split: {by_id:?}");

    p.write(
        "jobs/job.toml",
        &format!("{DECIDE_JOB}shard_by = \"episode\"\n"),
    );
    for k in 0..2 {
        std::fs::remove_file(p.path(&format!("runs/shard-{k}.csv"))).unwrap();
    }
    let shards = run_shards(&p);
    let mut all: Vec<&String> = shards.iter().flatten().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 12, "{shards:?}");
    for e in 0..4 {
        let holding: Vec<usize> = (0..2)
            .filter(|&k| shards[k].iter().any(|id| episode_of(id) == e))
            .collect();
        assert_eq!(
            holding.len(),
            1,
            "episode e{e} on shards {holding:?}: {shards:?}"
        );
    }
    for s in &shards {
        let n: Vec<usize> = s.iter().map(|id| id[1..].parse().unwrap()).collect();
        assert!(
            n.windows(2).all(|w| w[0] < w[1]),
            "not in file order: {s:?}"
        );
    }
}

#[test]
fn a_decision_without_its_group_is_refused() {
    let p = Project::new();
    episodes(&p, Some(3));
    p.write(
        "jobs/job.toml",
        &format!("{DECIDE_JOB}shard_by = \"episode\"\n"),
    );
    let o = p.bmoe(&["run", "jobs/job.toml", "--shard", "0/2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("decision \"s3\" (line 3 of"), "{t}");
    assert!(t.contains("has no \"episode\" in its meta"), "{t}");
    assert!(p.read("runs/decide.csv").is_empty(), "wrote rows");
}

/// (item, choice_logp, n_prefilled, reuse) of every row of a CSV.
fn decisions_of(csv: &str) -> Vec<(String, String, u64, String)> {
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h = rdr.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let (item, logp, pre, reuse) = (
        col("item"),
        col("choice_logp"),
        col("n_prefilled"),
        col("reuse"),
    );
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            (
                r[item].to_string(),
                r[logp].to_string(),
                r[pre].parse().unwrap(),
                r[reuse].to_string(),
            )
        })
        .collect()
}

/// Issue 33's fleet target: a replay split over 4 shards by episode, each shard a new process
/// with the prefix cache (`prefix_cache`), prefills at most 1.2x the tokens one process
/// replaying all of it does, and scores bit for bit the same. Each decision's prefix is a long
/// instruction every episode shares, so a shard restores what another shard saved.
#[test]
fn four_shards_with_the_prefix_cache_prefill_about_what_one_process_does() {
    let p = Project::new();
    let instructions = "You operate a phone app for the user. Read the screen, pick the one button that moves the task forward, and never pay without asking. ".repeat(2);
    let mut s = String::new();
    for i in 1..=12 {
        let e = (i - 1) % 4;
        s.push_str(&format!(
            "{{\"id\": \"s{i}\", \"prefix\": \"{instructions}\", \"suffix\": \"Episode {e}, step {i}: OK, Cancel or Help?\", \"choices\": [\"OK\", \"Cancel\", \"Help\"], \"meta\": {{\"episode\": \"e{e}\"}}}}\n"
        ));
    }
    p.write("jobs/decisions.jsonl", &s);
    p.write(
        "jobs/job.toml",
        &format!("{DECIDE_JOB}shard_by = \"episode\"\n"),
    );
    let o = p.bmoe(&["run", "jobs/job.toml", "--csv", "runs/one.csv", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let one = decisions_of(&p.read("runs/one.csv"));
    let mut sharded = Vec::new();
    for k in 0..4 {
        let csv = format!("runs/shard-{k}.csv");
        let o = p.bmoe(&[
            "run",
            "jobs/job.toml",
            "--shard",
            &format!("{k}/4"),
            "--csv",
            &csv,
            "--set",
            "prefix_cache=prefix-cache",
            "--allow-empty",
            "--quiet",
        ]);
        assert!(o.status.success(), "shard {k}: {}", text(&o));
        sharded.extend(decisions_of(&p.read(&csv)));
    }
    let total = |rows: &[(String, String, u64, String)]| rows.iter().map(|r| r.2).sum::<u64>();
    let (t1, t4) = (total(&one), total(&sharded));
    eprintln!("prefill tokens: one process {t1}, four shards with the prefix cache {t4}");
    assert!(
        t4 as f64 <= 1.2 * t1 as f64,
        "four shards prefilled {t4} tokens, one process {t1}: {sharded:?}"
    );
    assert!(sharded.iter().any(|r| r.3 == "restore"), "{sharded:?}");
    let mut a: Vec<_> = one.iter().map(|r| (&r.0, &r.1)).collect();
    let mut b: Vec<_> = sharded.iter().map(|r| (&r.0, &r.1)).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "scores differ between one process and the shards");
}
