//! Prefix reuse on a real sliding-window model (Gemma 3 270M, window 512): when the window has
//! already dropped cells the kept prefix needs, the decision restores the state saved where the
//! previous decision's rendered prefix ended (`reuse = restore`), and scores as a fresh session fed
//! the same two pieces, bit for bit, with the same `best` as a one-piece prefill.
//!
//! The model is not in the repository: `scripts/get-gemma3` writes `models/gemma3-270m.gguf`
//! (or set BMOE_GEMMA3 to a copy). Without it the test says so and passes.
mod common;

use common::logp_bits;
use std::path::PathBuf;

use bmoe_engine::{DecideRequest, LoadOptions, Model, PrefixReuse, ReuseOutcome, SessionOptions};

fn gemma() -> Option<PathBuf> {
    common::gemma3()
}

/// Two-token pieces: the context then holds few sequences (n_seq_max = min(16, n_batch), and the
/// batch is kept at 2 or more for whole-choice scoring, so one-token pieces give the same cache),
/// so the sliding-window cache is a little over 512 cells and a ~1,300-token prompt wraps it: the
/// earliest positions' cells are overwritten. Four-token pieces hold four sequences, and the
/// window no longer drops what the prefix needs (the decision extends; seen failing).
fn opts(reuse: PrefixReuse) -> SessionOptions {
    SessionOptions {
        threads: 1,
        n_ctx: 2048,
        n_ubatch: 2,
        n_ubatch_device: 2,
        prefix_reuse: reuse,
        ..Default::default()
    }
}

fn words(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("w{i} ")).collect()
}

fn req(prefix: &str, suffix: &str) -> DecideRequest {
    DecideRequest {
        prefix: prefix.into(),
        suffix: suffix.into(),
        choices: vec!["yes".into(), "no".into(), "maybe".into()],
        ..Default::default()
    }
}

// One test per mode, so the two run at once: each prefills ~1,300 tokens one at a time.
#[test]
fn swa_reuse_on_restores_the_saved_prefix_and_scores_as_two_fresh_pieces() {
    swa_reuse_restores(PrefixReuse::On);
}

#[test]
fn swa_reuse_auto_restores_the_saved_prefix_and_scores_as_two_fresh_pieces() {
    swa_reuse_restores(PrefixReuse::Auto);
}

fn swa_reuse_restores(mode: PrefixReuse) {
    let Some(path) = gemma() else { return };
    let m = Model::load(&LoadOptions::new(&path)).unwrap();
    // A long screen after the shared prefix: the window cannot keep the prefix's last cells.
    let prefix = format!("Task: read the log and answer. Log: {}", words(0, 120));
    let a = req(&prefix, &format!("Screen: {} Done?", words(1000, 260)));
    let b = req(&prefix, "Screen: empty. Done?");

    let mut x = m.session(&opts(mode)).unwrap();
    let first = x.decide(&a).unwrap();
    assert!(
        first.n_tokens > 768,
        "the first prompt wraps the window cache: {first:?}"
    );
    let r = x.decide(&b).unwrap();
    assert_eq!(r.reuse, ReuseOutcome::Restore, "{mode:?}: {r:?}");
    assert!(
        r.reuse_reason.contains("sliding window"),
        "the reason extend was refused: {r:?}"
    );
    assert!(r.n_reused > 0 && r.n_prefilled > 0, "{r:?}");
    assert_eq!(r.n_reused + r.n_prefilled, r.n_tokens);

    // A fresh session fed the same two pieces: the restored prefix, then the rest.
    let text = m
        .render_user_message(&format!("{}{}", b.prefix, b.suffix))
        .unwrap();
    let tokens = m.tokenize(&text, true).unwrap();
    let mut y = m.session(&opts(mode)).unwrap();
    y.prime(&tokens[..r.n_reused as usize]).unwrap();
    let two = y.decide(&b).unwrap();
    assert_eq!(two.reuse, ReuseOutcome::Extend, "{two:?}");
    assert_eq!(two.n_reused, r.n_reused);
    assert_eq!(
        logp_bits(&r),
        logp_bits(&two),
        "{mode:?}: restore == two fresh pieces, bit for bit"
    );

    // Reuse off: one piece from an empty cache; the same best.
    let mut z = m.session(&opts(PrefixReuse::Off)).unwrap();
    let one = z.decide(&b).unwrap();
    assert_eq!(one.best, r.best);
    let delta = r
        .choice_logp
        .iter()
        .zip(&one.choice_logp)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    eprintln!("{mode:?}: max |delta log-prob| restore vs one piece: {delta:e}");
}
