//! The engine core on the real llama.cpp and synthetic models: generate, decide, perplexity, and
//! the refusals.
mod common;

use bmoe_engine::{
    log_softmax, CancelToken, DecideRequest, EngineError, GenerateOptions, LoadOptions, Model,
    Sampling, Scoring,
};

fn load(p: &std::path::Path) -> Model {
    Model::load(&LoadOptions::new(p)).expect("load")
}

#[test]
fn greedy_generation_is_deterministic() {
    let m = load(&common::tiny());
    let opts = GenerateOptions {
        n_predict: 24,
        ..Default::default()
    };
    let mut s = m.session(&common::session_opts()).unwrap();
    let a = s
        .generate("Hello there", &opts, &CancelToken::new())
        .unwrap();
    let b = s
        .generate("Hello there", &opts, &CancelToken::new())
        .unwrap();
    // A second session too: nothing carries over between calls.
    let mut s2 = m.session(&common::session_opts()).unwrap();
    let c = s2
        .generate("Hello there", &opts, &CancelToken::new())
        .unwrap();
    assert!(!a.tokens.is_empty());
    assert_eq!(a.bytes, b.bytes);
    assert_eq!(a.bytes, c.bytes);
    assert_eq!(a.timing.n_decoded as usize, a.tokens.len());
    assert!(a.timing.n_prompt > 0 && a.timing.prefill_s > 0.0);
    // A different prompt gives a different continuation (the comparison can fail).
    let d = s
        .generate("Something else entirely", &opts, &CancelToken::new())
        .unwrap();
    assert_ne!(a.tokens, d.tokens);
}

#[test]
fn seeded_sampling_repeats_per_seed() {
    let m = load(&common::tiny());
    let mut s = m.session(&common::session_opts()).unwrap();
    let opts = |seed| GenerateOptions {
        n_predict: 24,
        sampling: Sampling::Seeded {
            seed,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        chat: true,
    };
    let a = s.generate("Hi", &opts(7), &CancelToken::new()).unwrap();
    let b = s.generate("Hi", &opts(7), &CancelToken::new()).unwrap();
    let c = s.generate("Hi", &opts(8), &CancelToken::new()).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens);
}

#[test]
fn cancelled_generation_stops_and_says_so() {
    let m = load(&common::tiny());
    let mut s = m.session(&common::session_opts()).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    let r = s
        .generate("Hi", &GenerateOptions::default(), &cancel)
        .unwrap();
    assert!(r.cancelled);
    assert!(r.tokens.is_empty());
}

#[test]
fn decide_scores_choices_over_the_whole_vocabulary() {
    let m = load(&common::tiny());
    let mut s = m.session(&common::session_opts()).unwrap();
    let req = DecideRequest {
        prefix: "You are on a settings screen. ".into(),
        suffix: "Which button? A, B or C.".into(),
        choices: vec!["A".into(), "B".into(), "C".into()],
        ..Default::default()
    };
    let r = s.decide(&req).unwrap();
    assert_eq!(r.choice_logp.len(), 3);
    assert!(r.choice_logp.iter().all(|v| v.is_finite() && *v < 0.0));
    let mass: f64 = r.choice_logp.iter().map(|v| v.exp()).sum();
    assert!(mass <= 1.0 + 1e-9, "probabilities sum to {mass}");
    let max = r
        .choice_logp
        .iter()
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(r.choice_logp[r.best], max);
    // Same request, same numbers, bit for bit.
    let r2 = s.decide(&req).unwrap();
    assert_eq!(r.choice_logp, r2.choice_logp);
}

#[test]
fn perplexity_is_exp_of_mean_nll_recomputed_from_logits() {
    let m = load(&common::tiny());
    let mut s = m.session(&common::session_opts()).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(6);
    let r = s.perplexity(&text).unwrap();
    assert!(r.ppl.is_finite() && r.ppl > 1.0);
    let toks = m.tokenize(&text, true).unwrap();
    assert!(toks.len() <= s.n_ctx(), "the test text must fit one window");
    let rows = s.eval_logits(&toks).unwrap();
    assert_eq!(rows.len(), toks.len());
    let nll: f64 = (0..toks.len() - 1)
        .map(|i| -log_softmax(&rows[i])[toks[i + 1] as usize])
        .sum();
    let mean = nll / (toks.len() - 1) as f64;
    assert_eq!(r.n_scored as usize, toks.len() - 1);
    assert!(
        (r.nll_mean - mean).abs() < 1e-9,
        "{} vs {}",
        r.nll_mean,
        mean
    );
    assert!((r.ppl - mean.exp()).abs() < 1e-6 * r.ppl);
}

#[test]
fn missing_model_is_a_clear_error() {
    let e = Model::load(&LoadOptions::new("/nonexistent/model.gguf"))
        .err()
        .unwrap();
    assert!(matches!(e, EngineError::ModelMissing { .. }), "{e}");
    assert!(e.to_string().contains("does not exist"));
}

#[test]
fn a_file_that_is_not_a_gguf_is_a_clear_error() {
    let p = common::dir().join("not-a-model.gguf");
    std::fs::write(&p, b"this is text, not a model").unwrap();
    let e = Model::load(&LoadOptions::new(&p)).err().unwrap();
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e}");
}

#[test]
fn a_truncated_gguf_is_a_clear_error() {
    let full = std::fs::read(common::tiny()).unwrap();
    for cut in [10, full.len() / 2, full.len() - 100] {
        let p = common::dir().join(format!("truncated-{cut}.gguf"));
        std::fs::write(&p, &full[..cut]).unwrap();
        let e = Model::load(&LoadOptions::new(&p)).err().unwrap();
        let msg = e.to_string();
        assert!(matches!(e, EngineError::ModelLoad { .. }), "{msg}");
        assert!(msg.contains(&p.display().to_string()), "{msg}");
    }
}

#[test]
fn prompt_longer_than_context_is_refused_before_prefill() {
    let m = load(&common::tiny());
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            n_ctx: 256,
            ..common::session_opts()
        })
        .unwrap();
    let long = "x".repeat(2000);
    let e = s
        .generate(&long, &GenerateOptions::default(), &CancelToken::new())
        .err()
        .unwrap();
    assert!(matches!(e, EngineError::PromptTooLong { .. }), "{e}");
    let e = s
        .decide(&DecideRequest {
            prefix: long.clone(),
            suffix: String::new(),
            choices: vec!["A".into()],
            ..Default::default()
        })
        .err()
        .unwrap();
    assert!(matches!(e, EngineError::PromptTooLong { .. }), "{e}");
    // The session is still usable afterwards.
    s.generate(
        "ok",
        &GenerateOptions {
            n_predict: 4,
            ..Default::default()
        },
        &CancelToken::new(),
    )
    .unwrap();
}

#[test]
fn colliding_and_empty_choices_are_refused() {
    let m = load(&common::tiny());
    let mut s = m.session(&common::session_opts()).unwrap();
    let req = |choices: &[&str]| DecideRequest {
        prefix: "p".into(),
        suffix: "s".into(),
        choices: choices.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    };
    let e = s.decide(&req(&["Apple", "Avocado"])).err().unwrap();
    assert!(
        matches!(
            e,
            EngineError::CollidingChoices {
                first: 0,
                second: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = s.decide(&req(&[])).err().unwrap();
    assert!(matches!(e, EngineError::NoChoices), "{e}");
    let e = s.decide(&req(&["A", ""])).err().unwrap();
    assert!(
        matches!(e, EngineError::EmptyChoice { index: 1, .. }),
        "{e}"
    );
}

/// The vocabulary-only tokenizer `bmoe check` uses sees the prompt and the choices exactly as a
/// decision does: the same prompt tokens (chat template applied), and the same choices refused for
/// adding no token (here `s>` after a raw prompt ending in `<` becomes the special `<s>` token,
/// which replaces the prompt's last token).
#[test]
fn tokenizer_refuses_the_choices_decide_refuses() {
    let p = common::tiny();
    let m = load(&p);
    let tok = bmoe_engine::Tokenizer::load(&p).expect("vocab-only load");
    let mut s = m.session(&common::session_opts()).unwrap();
    for scoring in [Scoring::FirstToken, Scoring::Sum, Scoring::Mean] {
        let chat = DecideRequest {
            prefix: "Task: pick.\n".into(),
            suffix: "Screen: A or B".into(),
            choices: vec!["A".into(), "B".into()],
            scoring,
            ..Default::default()
        };
        let r = s.decide(&chat).unwrap();
        let text = tok.prompt_text(&chat).unwrap();
        assert_eq!(m.tokenize(&text, true).unwrap().len(), r.n_tokens as usize);
        assert!(tok.empty_choices(&chat).unwrap().is_empty());
    }
    let raw = DecideRequest {
        prefix: "Pick <".into(),
        choices: vec!["A".into(), "s>".into()],
        scoring: Scoring::Sum,
        raw: true,
        ..Default::default()
    };
    let e = s.decide(&raw).err().unwrap();
    assert!(
        matches!(e, EngineError::EmptyChoice { index: 1, .. }),
        "{e}"
    );
    let found = tok.empty_choices(&raw).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(matches!(
        found[0],
        EngineError::EmptyChoice { index: 1, .. }
    ));
    assert!(matches!(
        bmoe_engine::Tokenizer::load(std::path::Path::new("/nonexistent.gguf")),
        Err(EngineError::ModelMissing { .. })
    ));
}

#[test]
fn n_expert_used_override_changes_the_output_and_is_range_checked() {
    let p = common::tiny();
    let base = load(&p);
    let top1 = Model::load(&LoadOptions {
        n_expert_used: Some(1),
        ..LoadOptions::new(&p)
    })
    .unwrap();
    assert_eq!(top1.info().n_expert_used, 1);
    let req = DecideRequest {
        prefix: "Pick: ".into(),
        suffix: "A or B".into(),
        choices: vec!["A".into(), "B".into()],
        ..Default::default()
    };
    let a = base
        .session(&common::session_opts())
        .unwrap()
        .decide(&req)
        .unwrap();
    let b = top1
        .session(&common::session_opts())
        .unwrap()
        .decide(&req)
        .unwrap();
    assert_ne!(a.choice_logp, b.choice_logp);
    let e = Model::load(&LoadOptions {
        n_expert_used: Some(99),
        ..LoadOptions::new(&p)
    })
    .err()
    .unwrap();
    assert!(matches!(e, EngineError::InvalidOption(_)), "{e}");
}
