//! Decision gates. G18a: a decision scored after reusing a prefix equals, bit for bit, the same
//! decision on a fresh session fed the same two pieces; against a one-piece prefill, the same
//! `best` (with `prefix_reuse = auto`, bit for bit). G18b: fifty decisions whose prefixes repeat,
//! extend, shrink and diverge mid-word, with a generate and a perplexity in between: reuse on and
//! auto against reuse off, resident and streamed with an evicting cache (the loopback prefill
//! device variant lives with the device gates). G18c: `sum` scoring of one-token choices equals
//! `first_token` bit for bit, and `sum` of a longer choice equals teacher forcing of prompt +
//! choice.
mod common;

use common::{logp_bits, req, trace, PREFIX};

use bmoe_engine::{
    CancelToken, DecideRecord, DecideRequest, GenerateOptions, LoadOptions, Model, PrefixReuse,
    ReuseOutcome, Scoring, SessionOptions, StreamOptions,
};

/// One compute thread and narrow pieces, so prompts span several pieces.
fn opts(reuse: PrefixReuse) -> SessionOptions {
    SessionOptions {
        threads: 1,
        n_ubatch: 16,
        prefix_reuse: reuse,
        ..common::session_opts()
    }
}

fn max_delta(a: &DecideRecord, b: &DecideRecord) -> f64 {
    a.choice_logp
        .iter()
        .zip(&b.choice_logp)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn g18a_reuse_equals_the_same_two_pieces_and_keeps_best() {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let a = req(PREFIX, "Screen: list of results. Which button? A, B or C.");
    let b = req(PREFIX, "Screen: a booking form. Which button? A, B or C.");

    // Reuse after a previous decision.
    let mut x = m.session(&opts(PrefixReuse::On)).unwrap();
    x.decide(&a).unwrap();
    let reused = x.decide(&b).unwrap();
    assert_eq!(reused.reuse, ReuseOutcome::Extend);
    assert!(reused.n_reused > 0 && reused.n_prefilled > 0, "{reused:?}");
    assert_eq!(reused.n_reused + reused.n_prefilled, reused.n_tokens);

    // A fresh session fed the same two pieces: the kept prefix, then the rest.
    let tokens = m
        .tokenize(
            &m.render_user_message(&format!("{}{}", b.prefix, b.suffix))
                .unwrap(),
            true,
        )
        .unwrap();
    assert_eq!(tokens.len(), reused.n_tokens as usize);
    let mut y = m.session(&opts(PrefixReuse::On)).unwrap();
    y.prime(&tokens[..reused.n_reused as usize]).unwrap();
    let two = y.decide(&b).unwrap();
    assert_eq!(two.n_reused, reused.n_reused);
    assert_eq!(
        logp_bits(&reused),
        logp_bits(&two),
        "reuse != the same two pieces"
    );

    // Against a one-piece fresh prefill: the same best, a small difference.
    let mut z = m.session(&opts(PrefixReuse::Off)).unwrap();
    let one = z.decide(&b).unwrap();
    assert_eq!(one.reuse, ReuseOutcome::Miss);
    assert_eq!(one.reuse_reason, "off");
    assert_eq!(reused.best, one.best);
    let d = max_delta(&reused, &one);
    eprintln!("G18a: max |delta log-prob| reuse on vs one piece = {d:e}");
    assert!(d <= 1e-3, "{d}");

    // auto cuts the kept prefix back to a piece boundary: bit for bit the one-piece prefill.
    let mut w = m.session(&opts(PrefixReuse::Auto)).unwrap();
    w.decide(&a).unwrap();
    let auto = w.decide(&b).unwrap();
    assert_eq!(auto.n_reused % 16, 0, "{auto:?}");
    assert!(auto.n_reused > 0);
    assert_eq!(logp_bits(&auto), logp_bits(&one), "auto != one piece");

    // The same prompt again: a hit, nothing prefilled, the same numbers.
    let again = w.decide(&b).unwrap();
    assert_eq!((again.reuse, again.n_prefilled), (ReuseOutcome::Hit, 0));
    assert_eq!(logp_bits(&again), logp_bits(&auto));
}

/// Runs the trace in one session; returns each decision's record.
fn replay(m: &Model, reuse: PrefixReuse) -> Vec<DecideRecord> {
    let mut s = m.session(&opts(reuse)).unwrap();
    let mut out = Vec::new();
    for (i, r) in trace().iter().enumerate() {
        out.push(s.decide(r).unwrap());
        if i == 20 {
            let g = GenerateOptions {
                n_predict: 6,
                ..Default::default()
            };
            s.generate("Between two decisions.", &g, &CancelToken::new())
                .unwrap();
        }
        if i == 35 {
            s.perplexity(&"Perplexity between decisions. ".repeat(4))
                .unwrap();
        }
    }
    out
}

/// Asserts G18b's rule: `auto` bit for bit `off`; `on` the same best, within 1e-3 (measured:
/// 3.3e-7 once the pieces after `on`'s kept prefix join the grid a fresh prefill uses; 4.4e-3
/// before, when they started where the kept prefix ended).
fn check_g18b(off: &[DecideRecord], on: &[DecideRecord], auto: &[DecideRecord], what: &str) {
    let mut worst = 0.0f64;
    for (i, ((a, b), c)) in off.iter().zip(on).zip(auto).enumerate() {
        assert_eq!(
            logp_bits(a),
            logp_bits(c),
            "{what}: decision {i}: auto != off"
        );
        assert_eq!(
            a.best, b.best,
            "{what}: decision {i}: best differs with reuse on"
        );
        let d = max_delta(a, b);
        if d > 1e-4 {
            eprintln!(
                "{what}: decision {i}: |delta| {d:e}, on kept {} and prefilled {} ({:?})",
                b.n_reused, b.n_prefilled, b.reuse
            );
        }
        worst = worst.max(d);
    }
    assert!(worst <= 1e-3, "{what}: {worst}");
    let reused: u32 = on.iter().map(|r| r.n_reused).sum();
    let total: u32 = on.iter().map(|r| r.n_tokens).sum();
    let outcomes: Vec<&str> = on.iter().map(|r| r.reuse.as_str()).collect();
    for o in ["miss", "extend", "hit"] {
        assert!(outcomes.contains(&o), "{what}: no {o} in {outcomes:?}");
    }
    eprintln!(
        "G18b {what}: reuse on kept {reused} of {total} prompt tokens; max |delta| vs off {worst:e}; auto bit-identical"
    );
}

#[test]
fn g18b_fifty_decisions_with_reuse_equal_reuse_off() {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let off = replay(&m, PrefixReuse::Off);
    assert!(off.iter().all(|r| r.n_reused == 0));
    let on = replay(&m, PrefixReuse::On);
    let auto = replay(&m, PrefixReuse::Auto);
    check_g18b(&off, &on, &auto, "resident");
}

/// The default widths (a 512-token ubatch): prompts are cut on the 64-token grid
/// (`PROMPT_GRID`), so `auto` keeps shared prefixes down to a multiple of 64, not of 512, and
/// stays bit for bit equal to reuse off; `on` joins the grid after its kept prefix.
#[test]
fn g18b_default_widths_reuse_on_the_grid() {
    let m = Model::load(&LoadOptions::new(common::tiny())).unwrap();
    let run = |reuse| {
        let o = SessionOptions {
            prefix_reuse: reuse,
            ..common::session_opts()
        };
        let mut s = m.session(&o).unwrap();
        trace()
            .iter()
            .map(|r| s.decide(r).unwrap())
            .collect::<Vec<_>>()
    };
    let (off, on, auto) = (
        run(PrefixReuse::Off),
        run(PrefixReuse::On),
        run(PrefixReuse::Auto),
    );
    check_g18b(&off, &on, &auto, "default widths");
    // Measured: `on` bit for bit `off` too at these widths (its first piece takes the kernel a
    // fresh prefill gives its rows); only `auto` is exact by construction.
    let extends = || auto.iter().filter(|r| r.reuse == ReuseOutcome::Extend);
    assert!(extends().all(|r| r.n_reused % 64 == 0), "auto off the grid");
    let finer = extends()
        .filter(|r| !r.n_reused.is_multiple_of(512))
        .count();
    assert!(
        finer > 10,
        "auto kept only multiples of 512 ({finer} decisions off them)"
    );
    // The last piece of a prompt (after its last multiple of 64) is padded to 64 rows from 24
    // rows on (`PAD_FROM`): the trace must prefill such tails, fresh and after a reuse.
    let tail = |r: &DecideRecord| r.n_tokens - (r.n_tokens - 1) / 64 * 64;
    let padded = |r: &&DecideRecord| r.n_prefilled > 0 && (24..64).contains(&tail(r));
    let (fresh, reused) = (
        off.iter().filter(padded).count(),
        extends().filter(|r| padded(r)).count(),
    );
    assert!(
        fresh > 5 && reused > 5,
        "padded tails: {fresh} fresh, {reused} after a reuse"
    );
    let kept = |v: &[DecideRecord]| v.iter().map(|r| r.n_reused).sum::<u32>();
    eprintln!(
        "default widths: auto kept {} tokens, on {}; padded tails {fresh} fresh, {reused} reused",
        kept(&auto),
        kept(&on)
    );
}

#[test]
fn g18b_streamed_with_an_evicting_cache() {
    let resident = Model::load(&common::in_file_layout(common::tiny())).unwrap();
    let off = replay(&resident, PrefixReuse::Off);
    drop(resident);
    // A cache smaller than one token's experts evicts on every layer.
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Mib(0),
            io_threads: 2,
            ..Default::default()
        }),
        ..LoadOptions::new(common::tiny())
    })
    .unwrap();
    let on = replay(&m, PrefixReuse::On);
    let auto = replay(&m, PrefixReuse::Auto);
    check_g18b(&off, &on, &auto, "streamed");
    assert!(m.stream_counters().read_bytes > 0);
}

#[test]
fn g18c_sum_scoring_equals_first_token_and_teacher_forcing() {
    g18c(common::tiny());
}

/// G18c on the small preset (8 layers, width 512, 32 experts top-4, Q4_0 experts in llama.cpp's
/// repacked layout): big enough for the errors the gate is there for (rows routed through other
/// kernels than the tiny model's, logits far from uniform).
#[test]
fn g18c_on_the_small_preset() {
    g18c(common::model(
        "small-qwen3moe",
        &bmoe_synth::SynthSpec::preset(bmoe_synth::Preset::Small, bmoe_synth::SynthArch::Qwen3Moe),
    ));
}

fn g18c(path: std::path::PathBuf) {
    let m = Model::load(&LoadOptions::new(path)).unwrap();
    let mut s = m.session(&opts(PrefixReuse::Off)).unwrap();
    let single = req(PREFIX, "Which button? A, B or C.");
    let first = s.decide(&single).unwrap();
    let sum = s
        .decide(&DecideRequest {
            scoring: Scoring::Sum,
            ..single.clone()
        })
        .unwrap();
    assert_eq!(sum.choice_ntok, vec![1, 1, 1]);
    assert_eq!(
        logp_bits(&first),
        logp_bits(&sum),
        "sum of one-token choices != first_token"
    );

    // Multi-token choices sharing a first token: refused by first_token, scored by sum/mean.
    let multi = DecideRequest {
        choices: vec![
            "click(submit)".into(),
            "click(cancel)".into(),
            "back".into(),
        ],
        scoring: Scoring::Sum,
        ..single.clone()
    };
    assert!(s
        .decide(&DecideRequest {
            scoring: Scoring::FirstToken,
            ..multi.clone()
        })
        .is_err());
    let r = s.decide(&multi).unwrap();
    let mean = s
        .decide(&DecideRequest {
            scoring: Scoring::Mean,
            ..multi.clone()
        })
        .unwrap();
    let text = m
        .render_user_message(&format!("{}{}", multi.prefix, multi.suffix))
        .unwrap();
    let ctx_len = m.tokenize(&text, true).unwrap().len();
    for (i, c) in multi.choices.iter().enumerate() {
        // Teacher forcing: the logits of every position of prompt + choice in one window.
        let whole = m.tokenize(&format!("{text}{c}"), true).unwrap();
        let rows = s.eval_logits(&whole).unwrap();
        let want: f64 = (ctx_len..whole.len())
            .map(|p| bmoe_engine::log_softmax(&rows[p - 1])[whole[p] as usize])
            .sum();
        let n = (whole.len() - ctx_len) as u32;
        assert_eq!(r.choice_ntok[i], n);
        assert!(
            (r.choice_logp[i] - want).abs() <= 1e-4,
            "choice {i}: sum {} vs teacher forcing {want}",
            r.choice_logp[i]
        );
        assert!((mean.choice_logp[i] - r.choice_logp[i] / f64::from(n)).abs() <= 1e-12);
    }
    // The choices ran as sequences beside the prompt: its cells are still reusable.
    let mut on = m.session(&opts(PrefixReuse::On)).unwrap();
    on.decide(&multi).unwrap();
    let again = on.decide(&multi).unwrap();
    assert_eq!(again.reuse, ReuseOutcome::Hit);
    assert_eq!(logp_bits(&again), logp_bits(&r));
}

/// G18b on a memory with a recurrent state (hybrid models): it cannot drop the tail of a
/// sequence, so reuse keeps a prefix only by restoring the state saved where the rendered prefix
/// ends; `auto` must still equal `off` bit for bit and `on` keep every `best`, and the trace must
/// really restore (a repeated decision hits).
fn g18b_recurrent(arch: bmoe_synth::SynthArch) {
    let spec = bmoe_synth::SynthSpec::preset(bmoe_synth::Preset::Tiny, arch);
    let m = Model::load(&LoadOptions::new(common::model(
        &format!("decide-{}", arch.name()),
        &spec,
    )))
    .unwrap();
    let off = replay(&m, PrefixReuse::Off);
    let on = replay(&m, PrefixReuse::On);
    let auto = replay(&m, PrefixReuse::Auto);
    let mut worst = 0.0f64;
    for (i, ((a, b), c)) in off.iter().zip(&on).zip(&auto).enumerate() {
        assert_eq!(
            logp_bits(a),
            logp_bits(c),
            "{}: decision {i}: auto != off",
            arch.name()
        );
        assert_eq!(
            a.best,
            b.best,
            "{}: decision {i}: best differs",
            arch.name()
        );
        worst = worst.max(max_delta(a, b));
    }
    // The design's bound for `on` (G18b): 1e-3 in log-prob. Measured: 1.5e-5 (qwen35moe) and
    // 2.6e-7 (nemotron_h_moe); the gate was seen red at 1e-6.
    assert!(worst <= 1e-3, "{}: {worst}", arch.name());
    for (what, runs) in [("on", &on), ("auto", &auto)] {
        let outcomes: Vec<&str> = runs.iter().map(|r| r.reuse.as_str()).collect();
        for o in ["restore", "hit"] {
            assert!(outcomes.contains(&o), "{what}: no {o} in {outcomes:?}");
        }
        let reused: u32 = runs.iter().map(|r| r.n_reused).sum();
        eprintln!(
            "G18b {} {what}: kept {reused} prompt tokens; max |delta| on vs off {worst:e}",
            arch.name()
        );
    }
}

#[test]
fn g18b_recurrent_qwen35moe() {
    g18b_recurrent(bmoe_synth::SynthArch::Qwen35Moe);
}

#[test]
fn g18b_recurrent_nemotron_h_moe() {
    g18b_recurrent(bmoe_synth::SynthArch::NemotronHMoe);
}
