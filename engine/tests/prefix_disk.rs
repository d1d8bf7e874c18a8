//! Prefix state on disk: a new process (here a new model load and session) restores the state a
//! previous one saved where a decision's rendered prefix ended, bit for bit a fresh prefill; a
//! damaged or foreign entry is ignored; the folder stays under its size limit.
mod common;

use common::{logp_bits, req, PREFIX};

use bmoe_engine::{
    DecideRecord, LoadOptions, Model, PrefixCache, PrefixReuse, ReuseOutcome, SessionOptions,
};

fn opts(cache: Option<PrefixCache>) -> SessionOptions {
    SessionOptions {
        prefix_reuse: PrefixReuse::Auto,
        prefix_cache: cache,
        ..common::session_opts()
    }
}

/// One decision in a "new process": a fresh model load and session.
fn decide_fresh(cache: Option<PrefixCache>, r: &bmoe_engine::DecideRequest) -> DecideRecord {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let mut s = m.session(&opts(cache)).unwrap();
    s.decide(r).unwrap()
}

fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn a_new_process_restores_a_saved_prefix_bit_for_bit() {
    let history = "tapped Search; typed pizza; scrolled down; opened Luigi's; ".repeat(6);
    let prefix = format!("{PREFIX}{history}");
    let first = req(&prefix, "Screen: list of results. Which button? A, B or C.");
    let second = req(&prefix, "Screen: a booking form. Which button? A, B or C.");
    let fresh = decide_fresh(None, &second);

    let dir = tempfile::tempdir().unwrap();
    let cache = |key: &str, max_bytes| PrefixCache {
        dir: dir.path().to_path_buf(),
        max_bytes,
        key: key.into(),
    };
    decide_fresh(Some(cache("tiny", 1 << 30)), &first);
    let saved = entries(dir.path());
    assert_eq!(saved.len(), 1, "{saved:?}");

    let restored = decide_fresh(Some(cache("tiny", 1 << 30)), &second);
    assert_eq!(restored.reuse, ReuseOutcome::Restore, "{restored:?}");
    assert_eq!(restored.reuse_reason, "prefix cache");
    assert!(
        restored.n_reused >= 64 && restored.n_reused.is_multiple_of(64),
        "{restored:?}"
    );
    assert_eq!(
        logp_bits(&restored),
        logp_bits(&fresh),
        "restored != a fresh prefill"
    );

    // Another key (model, setting or build) finds nothing.
    let foreign = decide_fresh(Some(cache("other model", 1 << 30)), &second);
    assert_eq!(foreign.reuse, ReuseOutcome::Miss);
    assert_eq!(logp_bits(&foreign), logp_bits(&fresh));

    // A damaged entry is ignored, never restored.
    let mut b = std::fs::read(&saved[0]).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&saved[0], &b).unwrap();
    let damaged = decide_fresh(Some(cache("tiny", 1 << 30)), &second);
    assert_ne!(damaged.reuse, ReuseOutcome::Restore, "{damaged:?}");
    assert_eq!(logp_bits(&damaged), logp_bits(&fresh));

    // Over the size limit the least recently used entries go.
    std::fs::remove_file(&saved[0]).unwrap();
    decide_fresh(Some(cache("tiny", 1)), &first);
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}
