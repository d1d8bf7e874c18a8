//! A session computes on one set of threads for its life: the threadpool it attaches is the one
//! llama.cpp's scheduler computes on. (A CPU device listed with the model gets a CPU backend of its
//! own, which the pool never reaches; every graph, one per routing node in a streamed decode, then
//! starts and joins fresh workers while the pool's sit idle.) One test: it reads this process's
//! thread list, so nothing else may run beside it.
mod common;

use std::collections::BTreeSet;

use bmoe_engine::{CancelToken, GenerateOptions, LoadOptions, Model, SessionOptions};

/// This process's thread ids.
fn tasks() -> BTreeSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Nanoseconds thread `tid` has run (`schedstat`, first field); 0 once it is gone.
fn cpu_ns(tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The calling thread's id (`/proc/thread-self` links to `<pid>/task/<tid>`).
fn this_thread() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

#[test]
fn a_session_computes_on_the_threads_it_keeps() {
    let path = common::tiny();
    for streamed in [true, false] {
        let m = Model::load(&LoadOptions {
            stream: if streamed {
                common::gates::stream(0, false)
            } else {
                None
            },
            ..LoadOptions::new(&path)
        })
        .unwrap();
        let before = tasks();
        let mut s = m
            .session(&SessionOptions {
                threads: 2,
                ..common::session_opts()
            })
            .unwrap();
        let kept: Vec<u32> = tasks().difference(&before).copied().collect();
        assert!(
            !kept.is_empty(),
            "streamed {streamed}: the session keeps a worker thread"
        );
        let me = this_thread();
        let (kept0, me0) = (kept.iter().map(|&t| cpu_ns(t)).sum::<u64>(), cpu_ns(me));
        s.generate(
            "Keep the threads, please, and compute on them.",
            &GenerateOptions {
                n_predict: 64,
                ..Default::default()
            },
            &CancelToken::default(),
        )
        .unwrap();
        let now = tasks();
        assert!(
            kept.iter().all(|t| now.contains(t)),
            "streamed {streamed}: the workers live as long as the session"
        );
        let kept_ns = kept.iter().map(|&t| cpu_ns(t)).sum::<u64>() - kept0;
        let me_ns = cpu_ns(me) - me0;
        // A streamed decode is cut into one graph per routing node, and the bug this guards
        // against gave each of those graphs fresh workers while the kept one sat idle: measured
        // here, the kept worker then ran 0.12x of the calling thread's time (an idle pool worker
        // still spins for a while after each wake), against 3.1x with the pool reached (its spin
        // between the many graphs counts too). A quarter sits between with room on both sides;
        // CI's load (ARM64 builds beside the tests) has cut a ratio by 2.2x. A resident decode
        // runs one graph per token, where the same bug measured 1.45x: nothing to tell apart, so
        // only the workers' lifetime is checked there.
        eprintln!("streamed {streamed}: kept worker {kept_ns} ns, calling thread {me_ns} ns");
        if streamed {
            assert!(
                kept_ns * 4 > me_ns,
                "streamed: the kept worker ran {kept_ns} ns against the calling thread's {me_ns} ns"
            );
        }
        drop(s);
        // A joined thread can stay listed for a moment after the join returns (the kernel wakes
        // the joiner as the thread exits, before it releases the task), so its end is waited for,
        // up to 2 s; a worker the session left running stays listed and fails this.
        let ended = (0..200).any(|_| {
            let after = tasks();
            let gone = kept.iter().all(|t| !after.contains(t));
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            gone
        });
        assert!(
            ended,
            "streamed {streamed}: the workers end with the session"
        );
    }
}
