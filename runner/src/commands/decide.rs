//! `bmoe decide`: load, score the choices once, print `best` and each choice's score.
use bmoe_engine::DecideRequest;

use super::one_shot::{load, print_counters, print_explain, Doc};
use crate::cli::engine_args::DecideArgs;

/// Scores the choices once and prints `best` and each choice's score (and, with `--expected`,
/// whether the best is the expected one).
pub fn decide(a: DecideArgs) -> anyhow::Result<()> {
    // Checked before the model loads: a typo should not cost a load.
    let expected = match &a.expected {
        Some(e) => Some(
            crate::config::item::resolve_expected_text(e, &a.choices)
                .map_err(|msg| anyhow::anyhow!("--expected {e:?}: {msg}"))?,
        ),
        None => None,
    };
    if a.choices.len() == 1 {
        eprintln!("bmoe: one choice is always the best: give two or more to score a decision");
    }
    let (model, session) = load(&a.engine)?;
    if !a.raw && model.chat_template().is_none() {
        eprintln!("bmoe: the model has no chat template: the prompt goes in raw (as with --raw)");
    }
    let mut s = model.session(&session)?;
    let rec = s.decide(&DecideRequest {
        prefix: a.prefix,
        suffix: a.suffix,
        choices: a.choices.clone(),
        scoring: a.scoring.engine(),
        raw: a.raw,
    })?;
    let correct = expected.map(|e| e == rec.best);
    if a.engine.out.json() {
        let mut v = serde_json::to_value(Doc::new(&rec, &model))?;
        if let (Some(obj), Some(e)) = (v.as_object_mut(), expected) {
            obj.insert("expected".into(), serde_json::json!(e));
            obj.insert("correct".into(), serde_json::json!(correct));
        }
        println!("{v}");
    } else {
        println!("best: {} ({:?})", rec.best, a.choices[rec.best]);
        for (i, (c, lp)) in a.choices.iter().zip(&rec.choice_logp).enumerate() {
            let ntok = rec.choice_ntok.get(i).copied().unwrap_or(1);
            println!("  {lp:>10.4}  p={:.4}  {ntok:>3} tok  {c:?}", lp.exp());
        }
        if rec.margin.is_finite() {
            println!("margin: {:.4} nats", rec.margin);
        }
        if let (Some(e), Some(ok)) = (expected, correct) {
            let verdict = if ok { "correct" } else { "incorrect" };
            println!("{verdict} (expected {e}: {:?})", a.choices[e]);
        }
    }
    eprintln!(
        "reuse: {} ({} reused, {} prefilled of {} tokens){}",
        rec.reuse.as_str(),
        rec.n_reused,
        rec.n_prefilled,
        rec.n_tokens,
        if rec.reuse_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", rec.reuse_reason)
        }
    );
    print_counters(&rec.timing, &rec.stream, &rec.prefill_dev);
    print_explain(&model);
    Ok(())
}
