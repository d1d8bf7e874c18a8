//! The stock llama.cpp runtime (`LoadOptions::stock`, the runner's `runtime = "llama.cpp"`): its
//! scores are llama.cpp's own, bit for bit (`llama.h` alone, `test_support::stock_reference`),
//! it keeps nothing between decisions, repacks as llama.cpp does, and refuses bmoe's mechanisms.
mod common;

use bmoe_engine::test_support::stock_reference;
use bmoe_engine::{log_softmax, LoadOptions, Model, PrefixReuse, Repack, Scoring};

/// Q4_0 experts and Q8_0 dense weights: types llama.cpp repacks, so its default repack runs on
/// both sides of the comparison.
fn model() -> std::path::PathBuf {
    common::tiny_q4_0()
}

fn stock(path: std::path::PathBuf) -> LoadOptions {
    LoadOptions {
        stock: true,
        ..LoadOptions::new(path)
    }
}

/// A raw first-token decision whose prompt is `words` words long.
fn decision(words: usize) -> bmoe_engine::DecideRequest {
    let history: String = (0..words).map(|i| format!("step{i} ")).collect();
    bmoe_engine::DecideRequest {
        scoring: Scoring::FirstToken,
        raw: true,
        ..common::req(&format!("{}{history}", common::PREFIX), "Which button?")
    }
}

/// A raw first-token decision after `prefix`.
fn raw(prefix: &str) -> bmoe_engine::DecideRequest {
    bmoe_engine::DecideRequest {
        scoring: Scoring::FirstToken,
        raw: true,
        ..common::req(prefix, "Which button?")
    }
}

#[test]
fn a_stock_decision_scores_what_llama_h_alone_computes_bit_for_bit() {
    let path = model();
    let m = Model::load(&stock(path.clone())).unwrap();
    let opts = common::session_opts();
    let mut s = m.session(&opts).unwrap();
    // Prompts bmoe's own prefill would cut differently: one of 24 to 63 tokens (bmoe pads it to
    // 64 rows), one past the 64-token grid (bmoe cuts it at 64). Stock llama.cpp decodes each in
    // one piece of the batch width, and so must the stock runtime.
    let long = decision(30);
    let short = raw("Task: tap the OK key.");
    let mut lengths = Vec::new();
    for req in [short, long] {
        let rec = s.decide(&req).unwrap();
        let text = format!("{}{}", req.prefix, req.suffix);
        let tokens = m.tokenize(&text, true).unwrap();
        assert_eq!(tokens.len(), rec.n_tokens as usize);
        lengths.push(tokens.len());
        let logits =
            stock_reference::last_logits(&path, &tokens, opts.n_ctx, opts.n_ubatch, 1).unwrap();
        let lp = log_softmax(&logits);
        let want: Vec<u64> = rec
            .choice_tokens
            .iter()
            .map(|&t| lp[t as usize].to_bits())
            .collect();
        assert_eq!(
            common::logp_bits(&rec),
            want,
            "stock vs llama.h, {} tokens",
            tokens.len()
        );
    }
    let (short, long) = (lengths[0], lengths[1]);
    assert!(
        (24..64).contains(&short),
        "{short} tokens: not a padded tail"
    );
    assert!(
        long > 64 && long % 64 >= 24,
        "{long} tokens: not past the grid"
    );
}

#[test]
fn a_stock_session_keeps_nothing_between_decisions() {
    let m = Model::load(&stock(model())).unwrap();
    let opts = bmoe_engine::SessionOptions {
        prefix_reuse: PrefixReuse::On,
        ..common::session_opts()
    };
    let mut s = m.session(&opts).unwrap();
    for _ in 0..2 {
        let rec = s.decide(&decision(30)).unwrap();
        assert_eq!((rec.n_reused, rec.n_prefilled), (0, rec.n_tokens));
    }
}

#[test]
fn stock_llama_cpp_repacks_as_llama_cpp_does_and_refuses_bmoe_mechanisms() {
    let m = Model::load(&LoadOptions {
        repack: Repack::Off,
        ..stock(model())
    })
    .unwrap();
    if bmoe_engine::cpu_repack_available() {
        assert!(
            m.load_stats().repacked.tensors > 0,
            "llama.cpp's default repack"
        );
    }
    let streamed = LoadOptions {
        stream: Some(bmoe_engine::StreamOptions::default()),
        ..stock(model())
    };
    let e = Model::load(&streamed).err().expect("refused").to_string();
    assert!(e.contains("moe_stream"), "{e}");
}
