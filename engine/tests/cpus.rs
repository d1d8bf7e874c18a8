//! The compute threads run on the CPUs a session names (ggml's threadpool mask, `strict_cpu`),
//! one thread per CPU, and the streamer's reader threads on the CPUs its options name. One test:
//! it pins its own thread and reads this process's thread list, so nothing else may run beside it.
mod common;

use bmoe_engine::{
    current_thread_cpus, CancelToken, GenerateOptions, LoadOptions, Model, SessionOptions,
    StreamOptions,
};

/// `Cpus_allowed_list` of each thread of this process whose name starts with `prefix`.
fn allowed(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = e.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !name.trim_end().starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            out.push(l["Cpus_allowed_list:".len()..].trim().to_string());
        }
    }
    out
}

#[test]
fn threads_run_on_the_cpus_they_are_given() {
    let cpus = current_thread_cpus().unwrap();
    assert!(cpus.len() >= 2, "this test needs two CPUs: {cpus:?}");
    let (a, b) = (cpus[0], cpus[1]);
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cpus: vec![a],
            ..common::gates::stream(1, false).unwrap()
        }),
        ..LoadOptions::new(common::tiny())
    })
    .unwrap();
    // The mask is a set: worker 1 gets its lowest CPU, the calling thread (worker 0) the next.
    let mut s = m
        .session(&SessionOptions {
            threads: 2,
            cpus: vec![a, b],
            ..common::session_opts()
        })
        .unwrap();
    s.generate(
        "Pin the threads, please.",
        &GenerateOptions {
            n_predict: 8,
            ..Default::default()
        },
        &CancelToken::default(),
    )
    .unwrap();
    assert_eq!(
        current_thread_cpus().unwrap(),
        vec![b],
        "the calling thread"
    );
    let io = allowed("bmoe-io");
    assert!(!io.is_empty(), "the streamer keeps reader threads");
    assert!(io.iter().all(|c| *c == a.to_string()), "readers: {io:?}");
    let ahead = allowed("bmoe-prefetch");
    assert!(
        ahead.iter().all(|c| *c == a.to_string()),
        "reads ahead: {ahead:?}"
    );
    // Besides the readers, exactly one thread sits on `a` alone: the pool's worker.
    let on_a = allowed("")
        .into_iter()
        .filter(|c| *c == a.to_string())
        .count();
    assert_eq!(
        on_a,
        io.len() + ahead.len() + 1,
        "one compute worker on {a}"
    );
    drop(s);
    // ggml leaves the calling thread pinned; an unpinned session gives it back every CPU.
    let mut s = m.session(&common::session_opts()).unwrap();
    s.generate(
        "Unpinned.",
        &GenerateOptions::default(),
        &CancelToken::default(),
    )
    .unwrap();
    assert_eq!(current_thread_cpus().unwrap(), cpus, "unpinned again");
}
