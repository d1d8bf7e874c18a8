//! `cache_mb = auto` on the one-shot commands plans for the call's own context: inside a memory
//! cgroup, the KV cache and compute buffers the plan leaves room for are those of `--context`,
//! not of the default 4096 tokens. A phone profile whose context fits its jobs gets the memory a
//! long context would have held as expert cache.
use crate::common::cgroup::Group;
use crate::common::{text, Project};

const MIB: u64 = 1 << 20;
/// The group's limit. The tiny model's plan counts about 22 MiB besides its experts (1.6 MiB)
/// at a 64-token context, and 90 MiB at 32,768 tokens (KV cache 32 MiB, compute buffers 36
/// MiB: `bmoe plan`); the floor is an eighth of the group, 8 MiB. So the short context leaves the
/// cache every expert, and the long one nothing; at the default 4096 tokens (35 MiB) both would
/// get every expert.
const LIMIT_MIB: u64 = 64;

/// The expert cache `bmoe generate` chose (its `moe-stream: on, expert cache N MiB` line).
fn generate_cache(p: &Project, g: &Group, context: &str) -> (u64, String) {
    let out = g
        .spawn(
            p.dir.path(),
            false,
            env!("CARGO_BIN_EXE_bmoe"),
            &[
                "generate",
                "-m",
                "models/tiny.gguf",
                "--raw",
                "-p",
                "The capital of Japan is",
                "-n",
                "4",
                "--moe-stream",
                "--cache-mb",
                "auto",
                "--context",
                context,
            ],
        )
        .output()
        .expect("run bmoe");
    let log = text(&out);
    assert!(out.status.success(), "--context {context}:\n{log}");
    let mib = log
        .lines()
        .find_map(|l| l.strip_prefix("moe-stream: on, expert cache "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no expert cache line:\n{log}"));
    (mib, log)
}

#[test]
fn the_one_shot_auto_cache_leaves_room_for_its_own_context() {
    let Some(g) = Group::new("auto-cache", LIMIT_MIB * MIB) else {
        eprintln!("skipped: needs root and the cgroup v1 memory controller");
        return;
    };
    let p = Project::new();
    let (short, log) = generate_cache(&p, &g, "64");
    assert_eq!(
        short, 2,
        "64 tokens: every expert (1.6 MiB, rounded up)\n{log}"
    );
    let (long, log) = generate_cache(&p, &g, "32768");
    assert_eq!(long, 0, "32768 tokens: nothing left for experts\n{log}");
    assert!(
        log.contains("leaves no expert cache"),
        "the user is told why:\n{log}"
    );
}
