//! Storage failing under a running model (issue 37): the model served through a FUSE file system
//! of the test's own (`common/faultfs.rs`) that fails one routed expert's bytes with EIO (or ends
//! them early, or answers short) after the load, and one that never answers a load's reads.
//! A streamed run meets the fault in an item: that row carries the file, offset and errno, the
//! run goes on, the expert is read again by the next item that needs it, and the exit status
//! says items were refused. A mapped weight page (a resident load's, a streamed load's dense
//! weights) that fails to read is the same: its SIGBUS becomes that item's error, or the load's
//! when the load itself reads it. A load that hangs is abandoned at `load_timeout_s`.
use crate::common;
#[path = "common/faultfs.rs"]
mod faultfs;

use std::collections::HashMap;
use std::path::Path;

use bmoe_engine::gguf::index::GgufIndex;
use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec, WeightType};
use common::{csv_rows, text, Project};
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
fn run(
    p: &Project,
) -> (
    Option<i32>,
    String,
    Vec<std::collections::BTreeMap<String, String>>,
) {
    let _ = std::fs::remove_file(p.path("runs/eio.csv"));
    let o = p.bmoe(&["run", "jobs/eio.toml", "--no-probe", "-q"]);
    (o.status.code(), text(&o), csv_rows(&p.read("runs/eio.csv")))
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
    rows: Vec<std::collections::BTreeMap<String, String>>,
    /// The faulted run's reads.
    reads: Vec<Read>,
    ranges: HashMap<(u32, u32), Vec<(u64, u64)>>,
    expert: (u32, u32),
    /// The clean run's text (every item's).
    reference: String,
    model: String,
}

/// The tiny shape 256 wide with Q4_0 experts, which the CPU repacks on AVX2 and ARM (the model of
/// gate G30): a decode node's repacked slices are read and repacked in two stages.
fn write_repacked_model(path: &Path) {
    let spec = SynthSpec {
        expert_type: WeightType::Q4_0,
        dense_type: WeightType::Q8_0,
        n_embd: 256,
        n_ff_exp: 256,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    write_model(&spec, path).expect("write the model");
}

fn faulted_run(fault: Fault, direct_io: bool) -> Faulted {
    faulted_run_on(fault, direct_io, false)
}

/// [`faulted_run`], on the repacked model where `repacked`.
fn faulted_run_on(fault: Fault, direct_io: bool, repacked: bool) -> Faulted {
    let p = Project::new();
    if repacked {
        write_repacked_model(&p.path("models/tiny.gguf"));
    }
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
    fault_goes_to_its_row(faulted_run(fault, direct_io), expect);
}

fn fault_goes_to_its_row(f: Faulted, expect: &[&str]) {
    let Faulted {
        code,
        out,
        rows: faulted,
        reads,
        ranges,
        expert: (il, e),
        reference,
        model,
    } = f;
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

/// The same on a model whose experts are repacked as read: a failed read in the middle of a
/// decode node's two-stage read and repack (`repacked::run_pipelined`) fails that item the same
/// way, and the slices read before it are not kept as if whole.
#[test]
fn eio_on_a_repacked_expert_fails_that_item_only() {
    fault_goes_to_its_row(
        faulted_run_on(Fault::Eio, false, true),
        &["Input/output error", "os error 5"],
    );
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

/// A job over the mounted model reading weights through its mapping: resident, or streamed (the
/// dense weights mapped, the experts read); one compute thread, so that which reads a fault
/// takes is the same from run to run.
fn mapped_job(model: &Path, streamed: bool, repack: &str) -> String {
    let mut job = streamed_job(model)
        .replace("n_predict = 16", "n_predict = 4")
        .replace(
            "[overrides]\n",
            &format!("[overrides]\nthreads = 1\nrepack = \"{repack}\"\n"),
        );
    if !streamed {
        job = job
            .replace("moe_stream = true", "moe_stream = false")
            .replace("cache_mb = 1\n", "")
            .replace("prefetch = \"off\"\n", "");
    }
    job
}

/// The first whole 4 KiB page inside tensor `name`: a bad block of that weight alone.
fn page_inside(model: &Path, name: &str) -> (u64, u64) {
    let idx = GgufIndex::open(model).unwrap();
    let loc = idx.get(name).unwrap();
    let a = loc.offset.next_multiple_of(4096);
    assert!(
        a + 4096 <= loc.offset + loc.size,
        "{name} holds a whole page"
    );
    (a, a + 4096)
}

/// The error a failed read of the mapped page at `offset` of `model` gives.
fn mapped_error(model: &Path, offset: u64) -> String {
    format!(
        "{}: reading the mapped page at offset {offset} failed (SIGBUS: the storage returned an I/O error)",
        model.display()
    )
}

fn eio(page: (u64, u64), times: u64) -> Rule {
    Rule {
        ranges: vec![page],
        fault: Fault::Eio,
        skip: 0,
        times,
    }
}

/// A streamed load maps the dense weights and computes one token over them (the graph captured
/// again once the tensors the file lacks are out of it): a page that fails to read there fails
/// the load, with the file and the page's offset, and no model with a zeroed page is kept.
/// Every item fails saying so; exit 1, no signal death.
#[test]
fn eio_on_a_dense_page_during_a_streamed_load_fails_the_load() {
    let p = Project::new();
    let fs = Mounted::serve(&p.path("models/tiny.gguf"), false);
    p.write("jobs/eio.toml", &mapped_job(&fs.path(), true, "off"));
    let page = page_inside(&fs.path(), "blk.1.attn_q.weight");
    // A clean run first: the model's hash is cached (it reads every byte).
    let (code, out, _) = run(&p);
    assert_eq!(code, Some(0), "{out}");
    fs.arm(eio(page, u64::MAX / 2));
    let (code, out, faulted) = run(&p);
    assert_eq!(code, Some(1), "items were refused, no signal death: {out}");
    assert_eq!(faulted.len(), ITEMS, "{out}");
    for r in &faulted {
        assert!(
            r["error"].contains(&mapped_error(&fs.path(), page.0)),
            "{faulted:?}"
        );
    }
    // The probe's child loads the model whole (mapped with MAP_POPULATE, which retries the page
    // in the kernel: see the next test): it is killed at the limit.
    let o = p.bmoe(&["check", "jobs/eio.toml", "--load-timeout", "2"]);
    let out = text(&o);
    assert!(
        o.status.code() == Some(2)
            && out.contains(
                "the load did not finish within 2 s (load_timeout_s); the probe's child was killed"
            ),
        "{out}"
    );
}

/// A resident load maps the model with MAP_POPULATE, which reads every page in the mmap call:
/// a page whose reads fail for good keeps that call retrying in the kernel (it neither fails
/// nor sends a SIGBUS), so the load never ends. `load_timeout_s` abandons it: every item fails
/// saying so, and the run ends (the process's exit ends the retrying thread). No signal death.
#[test]
fn a_resident_load_over_a_failing_page_is_abandoned_at_the_load_timeout() {
    let p = Project::new();
    let fs = Mounted::serve(&p.path("models/tiny.gguf"), false);
    p.write("jobs/eio.toml", &mapped_job(&fs.path(), false, "off"));
    let page = page_inside(&fs.path(), "blk.1.attn_q.weight");
    let (code, out, _) = run(&p);
    assert_eq!(code, Some(0), "{out}");
    fs.arm(eio(page, u64::MAX / 2));
    let _ = std::fs::remove_file(p.path("runs/eio.csv"));
    let o = p.bmoe(&[
        "run",
        "jobs/eio.toml",
        "--no-probe",
        "-q",
        "--load-timeout",
        "2",
    ]);
    let out = text(&o);
    let faulted = csv_rows(&p.read("runs/eio.csv"));
    assert_eq!(
        o.status.code(),
        Some(1),
        "items were refused, no signal death: {out}"
    );
    assert_eq!(faulted.len(), ITEMS, "{out}");
    for r in &faulted {
        assert!(
            r["error"].contains("the load did not finish within 2 s (load_timeout_s); abandoned"),
            "{faulted:?}"
        );
    }
    assert!(
        fs.reads().iter().any(|r| r.faulted),
        "the load never met the fault"
    );
}

/// Waits (at most 300 s) until `done` says so or the child ended; false when it ended first.
fn wait_for(child: &mut std::process::Child, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return done();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    false
}

/// Stops or continues the child (SIGSTOP / SIGCONT), so that the storage changes between two
/// of its instructions, not while the test looks.
/// A child that has ended (and was reaped) is left alone: the assertions on its status say why.
fn signal(child: &std::process::Child, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// A run reading a dense weight from its mapping (resident with `repack = "off"`, or streamed)
/// whose page goes bad after the load: the test stops the run after its first item, makes the
/// page fail and drops it from the page cache (FUSE's inval_inode: the kernel unmaps it from
/// bmoe too), lets the run go on until an item has failed, then lets the storage recover. The
/// items that met the bad page fail naming the file and offset, no zeroed result survives (every
/// other item equals the clean run's, the ones right after a failure included), exit 1.
fn mapped_fault_fails_the_items_that_meet_it(streamed: bool) {
    const MANY: usize = 24;
    let p = Project::new();
    let fs = Mounted::serve(&p.path("models/tiny.gguf"), false);
    let job = mapped_job(&fs.path(), streamed, "off").replace("n_predict = 4", "n_predict = 24");
    let prompts = (1..=MANY)
        .map(|i| format!("{{ id = \"p{i}\", text = \"Tell me about the storage.\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let job = job
        .lines()
        .map(|l| {
            if l.starts_with("prompts = ") {
                format!("prompts = [{prompts}]")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    p.write("jobs/eio.toml", &job);
    let page = page_inside(&fs.path(), "blk.1.attn_q.weight");
    let (code, out, clean) = run(&p);
    assert_eq!(code, Some(0), "{out}");
    let reference = clean[0]["text"].clone();
    assert!(clean.iter().all(|r| r["text"] == reference), "{clean:?}");

    let _ = std::fs::remove_file(p.path("runs/eio.csv"));
    let mut child = p
        .cmd(&["run", "jobs/eio.toml", "-q", "--no-probe"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The rows written so far (a line being written is not one yet).
    let n_rows = || {
        let c = std::fs::read_to_string(p.path("runs/eio.csv")).unwrap_or_default();
        csv_rows(&c[..c.rfind('\n').map_or(0, |i| i + 1)])
    };
    assert!(wait_for(&mut child, || !n_rows().is_empty()), "no row");
    signal(&child, "-STOP");
    let before = n_rows().len();
    assert!(before < MANY, "the run ended before the storage failed");
    fs.arm(eio(page, u64::MAX / 2));
    fs.invalidate(page.0, page.1 - page.0);
    signal(&child, "-CONT");
    let failed = wait_for(&mut child, || {
        n_rows().iter().any(|r| !r["error"].is_empty())
    });
    signal(&child, "-STOP");
    fs.disarm();
    signal(&child, "-CONT");
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "items were refused, no signal death: {status:?}"
    );
    let faulted = csv_rows(&p.read("runs/eio.csv"));
    assert!(failed, "no item failed: {faulted:?}");
    assert_eq!(faulted.len(), MANY);
    let bad: Vec<usize> = (0..MANY)
        .filter(|&i| !faulted[i]["error"].is_empty())
        .collect();
    eprintln!("items {bad:?} failed: {}", faulted[bad[0]]["error"]);
    for &i in &bad {
        assert!(
            i >= before && faulted[i]["error"].contains(&mapped_error(&fs.path(), page.0)),
            "item {i}: {faulted:?}"
        );
    }
    assert!(
        bad.last().is_some_and(|&l| l + 1 < MANY),
        "no item ran after the storage recovered: {faulted:?}"
    );
    for (i, r) in faulted.iter().enumerate().filter(|(i, _)| !bad.contains(i)) {
        assert_eq!(r["text"], reference, "item {i}: {faulted:?}");
    }
}

#[test]
fn eio_on_a_resident_mapped_page_fails_the_items_that_meet_it() {
    mapped_fault_fails_the_items_that_meet_it(false);
}

#[test]
fn eio_on_a_streamed_runs_dense_page_fails_the_items_that_meet_it() {
    mapped_fault_fails_the_items_that_meet_it(true);
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
    // A nightly's model was hashed before (the hash is cached by path, size and mtime): the hang
    // meets the load, not the hash, which reads the whole file. (A first run over hung storage
    // abandons its hash at the limit too, but that thread then holds the process until the
    // storage answers.)
    let o = p.bmoe(&[
        "run",
        "jobs/eio.toml",
        "-q",
        "--no-probe",
        "--limit",
        "1",
        "--csv",
        "runs/warm.csv",
    ]);
    assert!(o.status.success(), "{}", text(&o));
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
fn a_hung_probe_is_killed_at_the_load_timeout() {
    let (p, fs) = hung_model(false);
    let o = p.bmoe(&["run", "jobs/eio.toml", "-q", "--load-timeout", "2"]);
    let out = text(&o);
    let rows = csv_rows(&p.read("runs/eio.csv"));
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(rows.len(), ITEMS, "{out}");
    let want = "the load did not finish within 2 s (load_timeout_s); the probe's child was killed";
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
    while csv_rows(&p.read("runs/eio.csv")).len() < ITEMS
        && std::time::Instant::now() < deadline
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    fs.disarm();
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    let rows = csv_rows(&p.read("runs/eio.csv"));
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert_eq!(rows.len(), ITEMS, "{out}");
    for r in &rows {
        assert!(
            r["error"].contains("the load did not finish within 2 s (load_timeout_s); abandoned"),
            "{r:?}"
        );
    }
    assert!(
        fs.reads().iter().any(|r| r.faulted),
        "the load never met the hang"
    );
}
