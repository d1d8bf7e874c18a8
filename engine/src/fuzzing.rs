//! In-process entry points for coverage-guided fuzzing (`fuzz/`, `cargo fuzz`) and for replaying
//! its corpus in the ordinary test suite (`tests/fuzz_corpus.rs`). Each takes any bytes as a file
//! (a GGUF file, or a routing trace for `bmoe cache-sim`) and must return: an error is an answer,
//! a panic or an abort (ggml's asserts end the process) is a finding. None reads tensor data or
//! builds a model.
use std::io::Write;
use std::path::PathBuf;

use crate::gguf::index::GgufIndex;

/// A file holding the case's bytes, one per process, thread and `ext`, rewritten for each case
/// (ggml's reader reads from a file). In shared memory where there is some: nothing touches the
/// disk.
fn write_case(bytes: &[u8], ext: &str) -> (PathBuf, std::fs::File) {
    let dir = ["/dev/shm", "/run/shm"]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let tid = format!("{:?}", std::thread::current().id());
    let tid: String = tid.chars().filter(char::is_ascii_digit).collect();
    let path = dir.join(format!("bmoe-fuzz-{}-{tid}.{ext}", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("the fuzz case file can be written");
    f.write_all(bytes)
        .expect("the fuzz case file can be written");
    (path, f)
}

/// [`write_case`] for a GGUF file, its data section implied.
fn case_file(bytes: &[u8]) -> PathBuf {
    let (path, f) = write_case(bytes, "gguf");
    // The corpus holds headers only (a tiny model is 2-5 MB, its header 9-13 KB): the data
    // section the header declares is implied, as a hole in a sparse file, so the checks behind
    // the length checks are reached. Cut tensor data is `truncated_copies_are_refused`'s job.
    if let Ok(g) = crate::ffi::gguf::GgufFile::open(&path) {
        let end = g
            .tensors()
            .iter()
            .map(|(_, off, size)| off.saturating_add(*size))
            .max()
            .map_or(0, |e| e.saturating_add(g.data_offset()));
        if end > bytes.len() as u64 && end <= MAX_IMPLIED {
            f.set_len(end).expect("the fuzz case file can be extended");
        }
    }
    path
}

/// The largest file a header may imply (a hole costs nothing until written).
const MAX_IMPLIED: u64 = 1 << 40;

/// The first checks a model path gets (`check_file`: the header, every shard, the tensors and
/// hyper-parameters llama.cpp would abort on).
pub fn gguf_check(bytes: &[u8]) {
    let path = case_file(bytes);
    let _ = crate::gguf::check::check_file(&path);
}

/// How many layers the index reports for a header (`None` when it does not index): at most
/// llama.cpp's limit whatever `block_count` says.
pub fn index_layers(bytes: &[u8]) -> Option<usize> {
    Some(GgufIndex::open(&case_file(bytes)).ok()?.layers().len())
}

/// The index and every query the loaders and planners make of it.
pub fn gguf_index(bytes: &[u8]) {
    let path = case_file(bytes);
    let Ok(index) = GgufIndex::open(&path) else {
        return;
    };
    let _ = index.layers();
    let _ = index.arch();
    let _ = index.total_file_bytes();
    for t in index.tensor_infos() {
        let _ = index.get(&t.name);
        let n_expert = t.ne[2].max(1) as u64;
        let bytes = index.get(&t.name).map_or(0, |l| l.size / n_expert) as usize;
        let _ = index.expert_parts(&t.name, t.ty, t.ne[0], n_expert, bytes);
    }
}

/// The streamed load's header rebuild (`rebuilt_header`) for any header the index takes, done
/// always (the load does it only for split files and fused experts), read back by ggml's reader:
/// the rebuilt header must hold every tensor of the index and the key-values llama.cpp looks up.
pub fn gguf_rebuild(bytes: &[u8]) {
    let path = case_file(bytes);
    let Ok(index) = GgufIndex::open(&path) else {
        return;
    };
    // A refusal is an answer (a shape ggml's writer cannot hold, see `rebuilt_header`).
    let Ok(built) = crate::stream::lean_load::rebuilt_header(&index) else {
        return;
    };
    let back = case_file(&built.meta_bytes());
    let reread = GgufIndex::open(&back);
    // The rebuilt header has no data section: only a file whose tensors are all empty indexes.
    let header = match reread {
        Ok(i) => i.header().keys(),
        Err(_) => match crate::ffi::gguf::GgufFile::open(&back) {
            Ok(g) => g.keys(),
            Err(e) => panic!("ggml cannot read the header it wrote: {e}"),
        },
    };
    let fused: Vec<String> = index.fused_infos().into_iter().map(|f| f.name).collect();
    for (name, _, _) in built.tensors() {
        assert!(
            index.get(&name).is_some() || fused.contains(&name),
            "the rebuilt header holds a tensor {name:?} the file does not"
        );
    }
    for key in index.header().keys() {
        if !key.is_empty() {
            assert!(
                header.contains(&key),
                "the rebuilt header lost the key {key:?}"
            );
        }
    }
}

/// What `bmoe cache-sim` does with a routing trace: read and check it, its routing statistics,
/// the streamer's policy and Belady's optimum at the recorded budget, without a cache and at one
/// token's bytes.
pub fn routing_trace(bytes: &[u8]) {
    use crate::stream::{routing_stats, sim, trace::Trace};
    let (path, _) = write_case(bytes, "trace");
    let Ok(t) = Trace::read(&path) else {
        return;
    };
    let _ = routing_stats::stats(&t);
    let recorded = t.header.budget_bytes;
    let _ = sim::belady(&t, recorded);
    use crate::options::CachePolicy;
    for policy in [CachePolicy::NextUse, CachePolicy::Recency] {
        let _ = sim::replay(&t, recorded, true, policy);
        for budget in [0, t.header.token_bytes] {
            let _ = sim::replay(&t, budget, false, policy);
        }
    }
    for budget in [0, t.header.token_bytes] {
        let _ = sim::belady(&t, budget);
    }
}
