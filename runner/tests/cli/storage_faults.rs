//! Storage failing under a running model (issue 37): the model served through a FUSE file system
//! of the test's own (`common/faultfs.rs`) that fails one routed expert's bytes with EIO (or ends
//! them early, or answers short) after the load, and one that never answers a load's reads.
//! A streamed run meets the fault in an item: that row carries the file, offset and errno, the
//! run goes on, the expert is read again by the next item that needs it, and the exit status
//! says items were refused. A load that hangs is abandoned at `--load-timeout`.
use crate::common;
#[path = "common/faultfs.rs"]
mod faultfs;

use std::collections::HashMap;
use std::path::Path;

use bmoe_engine::gguf::index::GgufIndex;
use common::{text, Project};
use faultfs::{Fault, Mounted, Read, Rule};

/// Identical items: each needs the same experts, so an expert that failed in one is needed again
/// by the next.
const ITEMS: usize = 4;

fn streamed_job(model: &Path) -> String {
    let prompts = (1..=ITEMS)
        .map(|i| format!("{{ id = \"p{i}\", text = \"Tell me about the storage.\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
name = "eio"
model = "{}"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/eio.csv"
prompts = [{prompts}]
n_predict = 16

[overrides]
moe_stream = true
cache_mb = 1
prefetch = "off"
"#,
        model.display()
    )
}

fn rows(csv: &str) -> Vec<HashMap<String, String>> {
    csv::Reader::from_reader(csv.as_bytes())
        .deserialize()
        .map(|r| r.unwrap())
        .collect()
}

/// Each routed expert's bytes in the file: (layer, expert) -> its pieces (gate, up, down), cut
/// to the whole 4 KiB blocks inside each piece: the bad blocks a storage fault is made of. A
/// block a piece shares with its neighbour would fail the neighbour's aligned read too.
fn expert_ranges(model: &Path) -> HashMap<(u32, u32), Vec<(u64, u64)>> {
    let idx = GgufIndex::open(model).unwrap();
    let mut out: HashMap<(u32, u32), Vec<(u64, u64)>> = HashMap::new();
    for info in idx.tensor_infos() {
        let Some(rest) = info.name.strip_prefix("blk.") else {
            continue;
        };
        let (il, suffix) = rest.split_once('.').unwrap();
        if !suffix.contains("_exps.") {
            continue;
        }
        let loc = idx.get(&info.name).unwrap();
        let n_expert = info.ne[2] as u64;
        let per = loc.size / n_expert;
        for e in 0..n_expert {
            let start = loc.offset + e * per;
            let (a, b) = (start.next_multiple_of(4096), (start + per) / 4096 * 4096);
            assert!(a < b, "an expert piece of at least one whole block");
            out.entry((il.parse().unwrap(), e as u32))
                .or_default()
                .push((a, b));
        }
    }
    out
}

/// The expert a read falls in, if any.
fn expert_of(ranges: &HashMap<(u32, u32), Vec<(u64, u64)>>, r: &Read) -> Option<(u32, u32)> {
    ranges
        .iter()
        .find(|(_, v)| v.iter().any(|&(a, b)| r.offset < b && a < r.offset + r.len))
        .map(|(k, _)| *k)
}

/// A run of the job through the mount: its exit code, output and rows.
fn run(p: &Project) -> (Option<i32>, String, Vec<HashMap<String, String>>) {
    let _ = std::fs::remove_file(p.path("runs/eio.csv"));
    let o = p.bmoe(&["run", "jobs/eio.toml", "--no-probe", "-q"]);
    (o.status.code(), text(&o), rows(&p.read("runs/eio.csv")))
}

/// One expert read in the middle of the first item's decode, from a clean run's reads: the
/// expert, and how many of its reads come before that one.
fn pick_fault(ranges: &HashMap<(u32, u32), Vec<(u64, u64)>>, clean: &[Read]) -> ((u32, u32), u64) {
    let expert_reads: Vec<(u32, u32)> = clean.iter().filter_map(|r| expert_of(ranges, r)).collect();
    // The lean load reads no expert, so these are the items' reads, about a quarter each; a
    // prompt of a few tokens is one ubatch, so most of the first item's reads are its decode.
    let at = expert_reads.len() * 3 / (ITEMS * 5);
    let chosen = expert_reads[at];
    let before = expert_reads[..at].iter().filter(|&&k| k == chosen).count() as u64;
    (chosen, before)
}

/// A clean run of the streamed job through the mount, then the same run with `fault` on one
/// expert's next read after the load (then the storage recovers).
struct Faulted {
    code: Option<i32>,
    out: String,
    rows: Vec<HashMap<String, String>>,
    /// The faulted run's reads.
    reads: Vec<Read>,
    ranges: HashMap<(u32, u32), Vec<(u64, u64)>>,
    expert: (u32, u32),
    /// The clean run's text (every item's).
    reference: String,
    model: String,
}

fn faulted_run(fault: Fault, direct_io: bool) -> Faulted {
    let p = Project::new();
    let fs = Mounted::serve(&p.path("models/tiny.gguf"), direct_io);
    p.write("jobs/eio.toml", &streamed_job(&fs.path()));
    let ranges = expert_ranges(&fs.path());

    let (code, out, clean) = run(&p);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(clean.len(), ITEMS, "{out}");
    let reference = clean[0]["text"].clone();
    assert!(
        clean
            .iter()
            .all(|r| r["text"] == reference && r["error"].is_empty()),
        "identical items must give identical text: {clean:?}"
    );
    let (expert, before) = pick_fault(&ranges, &fs.reads());
    let n_before = fs.reads().len();
    fs.arm(Rule {
        ranges: ranges[&expert].clone(),
        fault,
        skip: before,
        times: 1,
    });
    let (code, out, rows) = run(&p);
    let reads = fs.reads()[n_before..].to_vec();
    assert!(
        reads.iter().any(|r| r.faulted),
        "the fault was never met: {out}"
    );
    Faulted {
        code,
        out,
        rows,
        reads,
        ranges,
        expert,
        reference,
        model: fs.path().display().to_string(),
    }
}

/// The item that met the fault has an error row naming the file, the offset and `expect`; the run
/// went on; the expert was read again later; the other items are the clean run's; exit 1.
fn expert_fault_goes_to_its_row(fault: Fault, direct_io: bool, expect: &[&str]) {
    let Faulted {
        code,
        out,
        rows: faulted,
        reads,
        ranges,
        expert: (il, e),
        reference,
        model,
    } = faulted_run(fault, direct_io);
    assert_eq!(
        code,
        Some(1),
        "items were refused, the exit status must say so: {out}"
    );
    assert_eq!(faulted.len(), ITEMS, "every item has its row: {out}");
    let bad: Vec<usize> = (0..ITEMS)
        .filter(|&i| !faulted[i]["error"].is_empty())
        .collect();
    assert_eq!(
        bad.len(),
        1,
        "exactly the item that met the fault fails: {faulted:?}"
    );
    let bad = bad[0];
    assert!(
        bad + 1 < ITEMS,
        "the fault was meant for an early item: {faulted:?}"
    );
    let err = &faulted[bad]["error"];
    eprintln!(
        "the faulted item (expert {e} of layer {il}, pieces {:?}): {err}",
        ranges[&(il, e)]
    );
    let at = reads
        .iter()
        .position(|r| r.faulted)
        .expect("the fault was met");
    // The offset is the expert piece's own (where its bytes start in the file), whatever
    // aligned range the kernel asked the file system for.
    assert!(
        err.contains(&model)
            && err.contains(&format!("reading experts of layer {il}: "))
            && ranges[&(il, e)]
                .iter()
                .any(|&(a, _)| (a.saturating_sub(4095)..=a)
                    .any(|o| err.contains(&format!("at offset {o} "))))
            && expect.iter().all(|s| err.contains(s)),
        "the row names the file, the offset and the error ({expect:?}): {err}"
    );
    // The run went on, and the expert was not kept as if read: a later item read it again and
    // every other item's text is the clean run's.
    assert!(
        reads[at + 1..]
            .iter()
            .any(|r| !r.faulted && expert_of(&ranges, r) == Some((il, e))),
        "expert {e} of layer {il} was never read again after its failed read"
    );
    for (i, r) in faulted.iter().enumerate().filter(|&(i, _)| i != bad) {
        assert_eq!(
            r["text"], reference,
            "item {i} after the fault: {faulted:?}"
        );
    }
}

#[test]
fn eio_on_an_expert_fails_that_item_only() {
    expert_fault_goes_to_its_row(Fault::Eio, false, &["Input/output error", "os error 5"]);
}

#[test]
fn eio_with_fuse_direct_io_fails_that_item_only() {
    expert_fault_goes_to_its_row(Fault::Eio, true, &["Input/output error", "os error 5"]);
}

/// A read answered short once (to FUSE, an end of file the kernel takes at its word): the
/// reader asks for the rest, and the run is the clean run.
#[test]
fn a_short_answer_is_completed() {
    let f = faulted_run(Fault::Short, false);
    assert_eq!(f.code, Some(0), "{}", f.out);
    for r in &f.rows {
        assert!(r["error"].is_empty(), "{r:?}");
        assert_eq!(r["text"], f.reference);
    }
}

/// Where the tensor data starts: everything from there on is what a load reads, not a header.
fn data_start(model: &Path) -> u64 {
    let idx = GgufIndex::open(model).unwrap();
    idx.tensor_infos()
        .iter()
        .filter_map(|i| idx.get(&i.name).map(|l| l.offset))
        .min()
        .unwrap()
}

/// A mount whose tensor data never answers (a hung device), and a job on it.
fn hung_model(streamed: bool) -> (Project, Mounted) {
    let p = Project::new();
    // direct_io: the hung reads hold no page-cache pages that a header read (the run's hash,
    // its checks) would then wait on.
    let fs = Mounted::serve(&p.path("models/tiny.gguf"), true);
    let mut job = streamed_job(&fs.path());
    if !streamed {
        job = job.replace("moe_stream = true", "moe_stream = false");
    }
    p.write("jobs/eio.toml", &job);
    let size = std::fs::metadata(fs.path()).unwrap().len();
    fs.arm(Rule {
        ranges: vec![(data_start(&fs.path()), size)],
        fault: Fault::Block,
        skip: 0,
        times: u64::MAX / 2,
    });
    (p, fs)
}

/// The probe's child hangs in the load (its reads never return): it is killed at the limit, and
/// the model's items fail saying so.
#[test]
#[ignore = "hangs in the test harness (issue 37 item 3): the run never ends after the FUSE read is released; not yet diagnosed"]
fn a_hung_probe_is_killed_at_the_load_timeout() {
    let (p, fs) = hung_model(false);
    let o = p.bmoe(&["run", "jobs/eio.toml", "-q", "--load-timeout", "2"]);
    let out = text(&o);
    let rows = rows(&p.read("runs/eio.csv"));
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(rows.len(), ITEMS, "{out}");
    let want = "the load did not finish within 2 s (--load-timeout); the probe's child was killed";
    for r in &rows {
        assert!(r["error"].contains(want), "{r:?}");
    }
    assert!(
        fs.reads().iter().any(|r| r.faulted),
        "the load never met the hang"
    );

    let o = p.bmoe(&["check", "jobs/eio.toml", "--load-timeout", "2"]);
    let out = text(&o);
    assert!(!o.status.success() && out.contains(want), "{out}");
}

/// Without the probe, the run's own load hangs: it is abandoned at the limit, and the items fail
/// saying so. The abandoned thread sits in a read the kernel does not end even for SIGKILL (a
/// FUSE or network read already sent waits for its answer), so the process ends only once the
/// storage answers: the test waits for the rows, then lets the storage answer.
#[test]
#[ignore = "hangs in the test harness (issue 37 item 3): the run never ends after the FUSE read is released; not yet diagnosed"]
fn a_hung_load_in_a_run_is_abandoned() {
    let (p, fs) = hung_model(true);
    let mut child = p
        .cmd(&[
            "run",
            "jobs/eio.toml",
            "-q",
            "--no-probe",
            "--load-timeout",
            "2",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while rows(&p.read("runs/eio.csv")).len() < ITEMS
        && std::time::Instant::now() < deadline
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    fs.disarm();
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    let rows = rows(&p.read("runs/eio.csv"));
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(rows.len(), ITEMS, "{out}");
    for r in &rows {
        assert!(
            r["error"].contains("the load did not finish within 2 s (--load-timeout); abandoned"),
            "{r:?}"
        );
    }
    assert!(
        fs.reads().iter().any(|r| r.faulted),
        "the load never met the hang"
    );
}
