//! A run's routing trace, replayed through the engine's cache policy at the run's cache size,
//! counts the misses the streamer counted; Belady's optimum never counts more.
mod common;

use bmoe_engine::sim;
use bmoe_engine::trace::{Event, Phase, Trace};
use bmoe_engine::{
    CachePolicy, CancelToken, GenerateOptions, LoadOptions, Model, Prefetch, StreamOptions,
};

const PROMPTS: [&str; 2] = [
    "A first prompt, long enough to be one wide piece of routing.",
    "A second prompt routes elsewhere, and decode follows it.",
];

/// Generates 48 tokens after each prompt (enough for `router`'s reads ahead to start and pause)
/// with a 1 MiB cache (the tiny model's 32 experts take 1.6 MiB, so the cache evicts) and a trace; returns the trace, the streamer's (all, decode) misses and the
/// decode graphs run.
fn traced_run(prefetch: Prefetch, cache_policy: CachePolicy) -> (Trace, u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.trace");
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Mib(1),
            io_threads: 2,
            prefetch,
            cache_policy,
            cache_reserve_mb: 0,
            routing_trace: Some(path.clone()),
            ..Default::default()
        }),
        ..LoadOptions::new(common::tiny())
    })
    .unwrap();
    let mut s = m.session(&common::session_opts()).unwrap();
    let (mut decode, mut graphs) = (0, 0);
    for p in PROMPTS {
        let opts = GenerateOptions {
            n_predict: 48,
            ..Default::default()
        };
        let rec = s.generate(p, &opts, &CancelToken::new()).unwrap();
        decode += rec.decode_stream.cache_misses;
        graphs += u64::from(rec.timing.n_decoded.saturating_sub(1));
    }
    let all = m.stream_counters().cache_misses;
    drop(s);
    drop(m);
    (Trace::read(&path).unwrap(), all, decode, graphs)
}

#[test]
fn the_replay_counts_the_misses_the_run_counted() {
    let runs = [
        (Prefetch::Off, CachePolicy::NextUse),
        (Prefetch::Eager, CachePolicy::NextUse),
        (Prefetch::Router, CachePolicy::NextUse),
        (Prefetch::Off, CachePolicy::Recency),
    ];
    for (prefetch, policy) in runs {
        let (t, all, decode, graphs) = traced_run(prefetch, policy);
        assert_eq!(t.header.policy(), Some(policy));
        let moves: Vec<u64> = t
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Budget { budget_bytes } => Some(*budget_bytes),
                Event::Node(_) => None,
            })
            .collect();
        // `router` pauses its reads ahead until they pay, lending the cache their staging (the
        // tiny model's 2 routed experts, at the largest layer's bytes an expert) and taking it
        // back when they start: each move is in the trace, or the replay below would not count
        // the run's misses. Whether they start within the run depends on how long decode waits
        // for reads (the read share, a time), so the moves are checked for what they may be,
        // not counted.
        let per_expert = t.header.layers.iter().map(|l| l.1).max().unwrap();
        let lent = 1048576 + u64::from(t.header.n_expert_used) * per_expert;
        if prefetch == Prefetch::Router {
            assert_eq!(t.header.budget_bytes, lent);
            assert!(
                moves.iter().all(|&m| m == 1048576 || m == lent),
                "{moves:?}"
            );
        } else {
            assert_eq!((t.header.budget_bytes, moves.len()), (1048576, 0));
        }
        let phases: Vec<Phase> = t
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Node(n) => Some(n.phase),
                Event::Budget { .. } => None,
            })
            .collect();
        assert!(phases.contains(&Phase::Prompt) && phases.contains(&Phase::Decode));
        let r = sim::replay(&t, t.header.budget_bytes, true, policy);
        assert_eq!(
            (r.misses(), r.decode.misses),
            (all, decode),
            "{prefetch:?}: {r:?}"
        );
        assert!(
            r.decode.misses > 0 && r.decode.routed > r.decode.misses,
            "the cache must both hit and miss: {r:?}"
        );
        // One token a decode graph.
        assert_eq!(r.decode.tokens, graphs);
        for mb in [0.25, 0.5, 1.0, 1.5] {
            let b = (mb * 1048576.0) as u64;
            let (lru, opt) = (sim::replay(&t, b, false, policy), sim::belady(&t, b));
            assert!(opt.misses() <= lru.misses(), "{mb} MiB: {opt:?} vs {lru:?}");
        }
    }
}
