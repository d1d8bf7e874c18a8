//! `norm` and `calibrated` scoring as lm-evaluation-harness defines `acc_norm` and
//! `acc_mutual_info`, checked against the per-token log-probabilities of teacher forcing: `norm`
//! is the choice's summed log-likelihood over its length in characters, `calibrated` that sum
//! minus the choice's log-likelihood after the neutral context (the BOS token alone). Also
//! `cpu_ubatch = 1` with whole-choice scoring (one row per piece).
mod common;
use common::{req, PREFIX};

use bmoe_engine::{log_softmax, DecideRequest, LoadOptions, Model, PrefixReuse, Scoring};

/// Summed log-probability of `whole[from..]`, each token scored by the logits of the position
/// before it, all positions of `whole` in one window.
fn teacher_forced(s: &mut bmoe_engine::Session<'_>, whole: &[i32], from: usize) -> f64 {
    let rows = s.eval_logits(whole).unwrap();
    (from..whole.len())
        .map(|p| log_softmax(&rows[p - 1])[whole[p] as usize])
        .sum()
}

fn opts(n_ubatch: u32) -> bmoe_engine::SessionOptions {
    bmoe_engine::SessionOptions {
        threads: 1,
        n_ubatch,
        prefix_reuse: PrefixReuse::Off,
        ..common::session_opts()
    }
}

#[test]
fn norm_and_calibrated_follow_lm_evals_formulas() {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let mut s = m.session(&opts(16)).unwrap();
    // Choices of different lengths in characters and tokens, one of them not ASCII.
    let base = DecideRequest {
        choices: vec![
            "click(submit)".into(),
            "back".into(),
            "scroll down the list".into(),
            "café".into(),
        ],
        ..req(PREFIX, "Which action? ")
    };
    let run = |s: &mut bmoe_engine::Session<'_>, scoring| {
        s.decide(&DecideRequest {
            scoring,
            ..base.clone()
        })
        .unwrap()
    };
    let norm = run(&mut s, Scoring::Norm);
    let calibrated = run(&mut s, Scoring::Calibrated);
    let text = m
        .render_user_message(&format!("{}{}", base.prefix, base.suffix))
        .unwrap();
    let ctx_len = m.tokenize(&text, true).unwrap().len();
    // lm-eval's unconditional context "" becomes the prefix token: here the BOS the model adds.
    let neutral = m.tokenize("", true).unwrap();
    assert_eq!(neutral.len(), 1, "the tiny model adds a BOS: {neutral:?}");
    for (i, c) in base.choices.iter().enumerate() {
        let whole = m.tokenize(&format!("{text}{c}"), true).unwrap();
        let ll = teacher_forced(&mut s, &whole, ctx_len);
        let want_norm = ll / c.chars().count() as f64;
        assert!(
            (norm.choice_logp[i] - want_norm).abs() <= 1e-5,
            "choice {i} {c:?}: norm {} vs {want_norm}",
            norm.choice_logp[i]
        );
        let mut alone = neutral.clone();
        alone.extend(m.tokenize(c, false).unwrap());
        let unconditional = teacher_forced(&mut s, &alone, 1);
        let want_cal = ll - unconditional;
        assert!(
            (calibrated.choice_logp[i] - want_cal).abs() <= 1e-4,
            "choice {i} {c:?}: calibrated {} vs {want_cal}",
            calibrated.choice_logp[i]
        );
        assert!(unconditional < 0.0 && unconditional.is_finite());
    }
    // norm ranks by per-character likelihood, so it may pick another best than sum: the record's
    // best is the arg max of its own scores.
    for r in [&norm, &calibrated] {
        let top = r
            .choice_logp
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        assert_eq!(r.best, top);
    }
}

/// `cpu_ubatch = 1` (pieces of one row, the prefill device's width 1 too, as the runner sets it
/// without a device): every whole-choice scoring runs (it used to fail with llama.cpp's "invalid
/// seq_id 1 >= 1": the context held one sequence) and `sum` equals teacher forcing in one-row
/// pieces.
#[test]
fn whole_choice_scoring_works_with_one_row_pieces() {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let base = DecideRequest {
        choices: vec!["click(submit)".into(), "back".into()],
        ..req(PREFIX, "Which action? ")
    };
    let mut one = m
        .session(&bmoe_engine::SessionOptions {
            n_ubatch_device: 1,
            ..opts(1)
        })
        .unwrap();
    let run = |s: &mut bmoe_engine::Session<'_>, scoring| {
        s.decide(&DecideRequest {
            scoring,
            ..base.clone()
        })
        .unwrap_or_else(|e| panic!("{scoring:?} with n_ubatch = 1: {e}"))
    };
    let sum = run(&mut one, Scoring::Sum);
    let norm = run(&mut one, Scoring::Norm);
    run(&mut one, Scoring::Mean);
    run(&mut one, Scoring::Calibrated);
    let text = m
        .render_user_message(&format!("{}{}", base.prefix, base.suffix))
        .unwrap();
    let ctx_len = m.tokenize(&text, true).unwrap().len();
    for (i, c) in base.choices.iter().enumerate() {
        let whole = m.tokenize(&format!("{text}{c}"), true).unwrap();
        let want = teacher_forced(&mut one, &whole, ctx_len);
        assert!(
            (sum.choice_logp[i] - want).abs() <= 1e-4,
            "choice {i}: sum {} vs teacher forcing {want}",
            sum.choice_logp[i]
        );
        let per_char = sum.choice_logp[i] / c.chars().count() as f64;
        assert!((norm.choice_logp[i] - per_char).abs() <= 1e-9);
    }
}
