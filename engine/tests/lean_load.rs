//! A streamed model's load reads the GGUF's header and dense weights, never its experts: from a
//! cold page cache, after a load and a generate, no page that lies wholly inside an expert tensor
//! is in the page cache (the streamer reads experts with O_DIRECT), and the load's storage reads
//! stay near the dense bytes. llama.cpp's own load (`llama_load`, the negative control) maps the
//! file with `MAP_POPULATE` and brings every expert page in. One test: `/proc/self/io` counts the
//! whole process, so nothing else may run beside it.
mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use bmoe_engine::gguf::index::GgufIndex;
use bmoe_engine::{GenerateOptions, LoadOptions, Model, StreamOptions};

/// Syncs and drops the file's pages from the page cache.
fn evict(path: &Path) {
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: a valid descriptor; advice only.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
}

/// Per page of the file, whether it is in the page cache.
fn cached_pages(path: &Path) -> Vec<bool> {
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096usize;
    let n = len.div_ceil(page);
    // SAFETY: a fresh read-only shared mapping of the whole file, unmapped below; mincore only
    // reports residency and touches no page.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let mut v = vec![0u8; n];
        assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0, "mincore");
        libc::munmap(p, len);
        v.into_iter().map(|b| b & 1 == 1).collect()
    }
}

/// Pages lying wholly inside the tensors `pick` selects, and their bytes.
fn pages_of(index: &GgufIndex, names: &[String], pick: impl Fn(&str) -> bool) -> (Vec<usize>, u64) {
    let page = 4096u64;
    let mut pages = Vec::new();
    let mut bytes = 0;
    for n in names.iter().filter(|n| pick(n)) {
        let loc = index.get(n).unwrap();
        bytes += loc.size;
        let first = loc.offset.div_ceil(page);
        let end = (loc.offset + loc.size) / page;
        pages.extend((first..end).map(|p| p as usize));
    }
    (pages, bytes)
}

struct Load {
    read_bytes: u64,
    expert_pages_cached: usize,
    dense_pages_cached: usize,
    warnings: Vec<String>,
}

fn load_and_generate(path: &Path, llama_load: bool, index: &GgufIndex, names: &[String]) -> Load {
    evict(path);
    let before = bmoe_engine::telemetry::storage_read_bytes().expect("/proc/self/io");
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Mib(0),
            io_threads: 1,
            llama_load,
            ..Default::default()
        }),
        ..LoadOptions::new(path)
    })
    .expect("load");
    let read_bytes = bmoe_engine::telemetry::storage_read_bytes().unwrap() - before;
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            threads: 1,
            ..common::session_opts()
        })
        .unwrap();
    s.generate(
        "Load only what you need.",
        &GenerateOptions {
            n_predict: 4,
            ..Default::default()
        },
        &bmoe_engine::CancelToken::default(),
    )
    .unwrap();
    let cached = cached_pages(path);
    let (experts, _) = pages_of(index, names, |n| n.contains("_exps."));
    let (dense, _) = pages_of(index, names, |n| !n.contains("_exps."));
    Load {
        read_bytes,
        expert_pages_cached: experts.iter().filter(|&&p| cached[p]).count(),
        dense_pages_cached: dense.iter().filter(|&&p| cached[p]).count(),
        warnings: m.warnings().to_vec(),
    }
}

#[test]
fn a_streamed_load_reads_no_expert() {
    let path = common::tiny();
    let index = GgufIndex::open(&path).unwrap();
    let names: Vec<String> = index
        .header()
        .tensor_infos()
        .into_iter()
        .map(|t| t.name)
        .collect();
    let (expert_pages, expert_bytes) = pages_of(&index, &names, |n| n.contains("_exps."));
    let (dense_pages, dense_bytes) = pages_of(&index, &names, |n| !n.contains("_exps."));
    assert!(!expert_pages.is_empty() && !dense_pages.is_empty());

    let lean = load_and_generate(&path, false, &index, &names);
    if lean.warnings.iter().any(|w| w.contains("O_DIRECT")) {
        eprintln!("skipped: O_DIRECT is not usable where the test model lives, so expert reads go through the page cache");
        return;
    }
    assert!(
        lean.warnings.iter().all(|w| !w.contains("llama.cpp way")),
        "the lean load fell back: {:?}",
        lean.warnings
    );
    let llama = load_and_generate(&path, true, &index, &names);
    eprintln!(
        "expert bytes {expert_bytes}, dense bytes {dense_bytes}; load read {} bytes (lean) vs {} (llama.cpp); expert pages cached {}/{} vs {}/{}; dense pages cached {} vs {}",
        lean.read_bytes,
        llama.read_bytes,
        lean.expert_pages_cached,
        expert_pages.len(),
        llama.expert_pages_cached,
        expert_pages.len(),
        lean.dense_pages_cached,
        llama.dense_pages_cached,
    );
    // The measurement sees pages at all: the dense weights were read through the mapping.
    assert!(lean.dense_pages_cached * 2 >= dense_pages.len());
    assert_eq!(
        lean.expert_pages_cached, 0,
        "an expert page was read through the page cache"
    );
    // Negative control: llama.cpp's load populates the whole mapping.
    assert!(llama.expert_pages_cached * 2 >= expert_pages.len());
    // Header and dense weights, plus a few pages at tensor edges.
    assert!(
        lean.read_bytes <= dense_bytes * 12 / 10 + (256 << 10),
        "the lean load read {} bytes for {dense_bytes} dense bytes",
        lean.read_bytes
    );
    assert!(llama.read_bytes >= expert_bytes);
}
