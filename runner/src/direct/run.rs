//! `bmoe generate`, `bmoe decide`, `bmoe ppl`: load, run once, print the record.
use std::io::Write;

use anyhow::Context;
use bmoe_engine::{
    CancelToken, DecideRequest, GenerateOptions, Model, PrefillDevCounters, Sampling,
    SessionOptions, StreamCounters, Timing,
};

use super::args::{DecideArgs, EngineArgs, GenerateArgs, PplArgs};

fn load(e: &EngineArgs) -> anyhow::Result<(Model, SessionOptions)> {
    bmoe_engine::set_log_verbose(e.verbose);
    // Every value and every combination is checked before the model is read.
    let d = e.resolve()?;
    d.load.validate()?;
    d.session.validate(d.load.prefill.as_ref())?;
    if let Some(note) = d.threads.capped_note() {
        eprintln!("bmoe: {note}");
    }
    // `cache_mb = auto` leaves room for this call's own context, not the default one.
    let m = Model::load_for(&d.load, &d.session)?;
    for w in m.warnings() {
        eprintln!("bmoe: {w}");
    }
    let st = m.load_stats();
    let read = st
        .read_bytes
        .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
        .unwrap_or_else(|| "?".into());
    match (st.mode, m.lean_load()) {
        (bmoe_engine::LoadMode::Lean, Some(l)) => eprintln!(
            "load: {:.2} s, {read} read from storage (header and {:.1} MiB of dense weights; no expert){}",
            st.seconds,
            l.dense_bytes as f64 / 1048576.0,
            match l.unlinked_tensors {
                Some(n) if n > 0 => format!("; {n} optional tensors the file lacks left out of the graph"),
                _ => String::new(),
            }
        ),
        _ => eprintln!(
            "load: {:.2} s, {read} read from storage (llama.cpp's load: the whole file)",
            st.seconds
        ),
    }
    if st.repacked.tensors > 0 {
        eprintln!(
            "repack: {} weight tensors ({:.1} MiB) in the CPU's repacked layout",
            st.repacked.tensors,
            st.repacked.bytes as f64 / 1048576.0
        );
    }
    if let Some(b) = m.stream_budget_bytes() {
        eprintln!("moe-stream: on, expert cache {} MiB", b >> 20);
    }
    Ok((m, d.session))
}

/// A share for the CLI's lines: one decimal and a percent sign, `n/a` when there was nothing to
/// share.
fn pct(v: Option<f64>) -> String {
    v.map(|p| format!("{p:.1}%"))
        .unwrap_or_else(|| "n/a".into())
}

/// The decode phase's own streaming counters: what decode speed depends on, apart from the
/// prompt's reads.
fn print_decode_stream(rec: &bmoe_engine::GenerateRecord) {
    let (t, d) = (&rec.timing, &rec.decode_stream);
    if t.n_decoded > 0 && d.cache_hits + d.cache_misses > 0 {
        eprintln!(
            "moe-stream decode: {:.1} MiB read ({:.2} MiB/token), stall {:.3} s of {:.3} s decoding ({:.1}%), cache hit {}",
            d.read_mib(),
            d.read_mib() / f64::from(t.n_decoded),
            d.stall_s,
            t.decode_s,
            100.0 * d.stall_s / t.decode_s.max(1e-9),
            pct(d.cache_hit_pct()),
        );
        print_stall_parts(d);
        if d.predict_s > 0.0 {
            // What `prefetch = router` costs decode even when it reads nothing ahead.
            eprintln!(
                "prefetch decode: predicting took {:.1} ms ({:.3} ms a token, {:.2}% of decoding)",
                1e3 * d.predict_s,
                1e3 * d.predict_s / f64::from(t.n_decoded),
                100.0 * d.predict_s / t.decode_s.max(1e-9),
            );
        }
    }
}

/// What decode's stall at routing nodes was made of: reads and repacks (summed over the threads
/// that ran them, so with reads on several lanes at once they can add up to more than the stall),
/// page moves, and the rest (the cache's bookkeeping, waits for reads ahead).
fn print_stall_parts(d: &StreamCounters) {
    if d.cache_misses == 0 {
        return;
    }
    let parts = d.read_s + d.repack_s + d.evict_s + d.move_s;
    let rest = if parts <= d.stall_s {
        format!("{:.3} s", d.stall_s - parts)
    } else {
        "n/a (reads overlapped on lanes)".into()
    };
    eprintln!(
        "moe-stream decode stall: reads {:.3} s, repacking {:.3} s, evicting {:.3} s, moving pages in {:.3} s, the rest {rest}",
        d.read_s, d.repack_s, d.evict_s, d.move_s,
    );
}

/// The profiling report of `--explain-prefill`, when it ran.
fn print_explain(m: &bmoe_engine::Model) {
    if let Some(r) = m.explain_prefill() {
        eprint!("{}", r.render());
    }
}

fn print_counters(t: &Timing, s: &StreamCounters, d: &PrefillDevCounters) {
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s)",
        t.n_prompt,
        t.prefill_s,
        t.prefill_tps()
    );
    if t.n_decoded > 0 {
        eprintln!(
            "decode: {} tokens in {:.3} s ({:.2} tok/s)",
            t.n_decoded,
            t.decode_s,
            t.tok_s()
        );
    }
    if s.read_bytes > 0 || s.cache_hits + s.cache_misses > 0 {
        let per_tok = f64::from((t.n_decoded + t.n_prompt).max(1));
        eprintln!(
            "moe-stream: {:.1} MiB read ({:.2} MiB/token) in {:.3} s, stall {:.3} s, cache hit {}, {} evictions ({} expert slices read into their pages), {:.1} MiB resident{}",
            s.read_mib(),
            s.read_mib() / per_tok,
            s.read_s,
            s.stall_s,
            pct(s.cache_hit_pct()),
            s.evictions,
            s.recycled,
            s.resident_bytes as f64 / 1048576.0,
            match s.repacked {
                0 => String::new(),
                n => format!(", {n} expert slices repacked as read"),
            }
        );
    }
    if s.substituted + s.dropped > 0 {
        eprintln!(
            "lossy: {} routed experts replaced by cached ones at a miss (expert_substitute), {} skipped (drop_cold)",
            s.substituted, s.dropped
        );
    }
    if s.cache_shrinks + s.cache_grows > 0 {
        eprintln!(
            "memory pressure: the expert cache shrank {} times and grew back {} times; its budget is {:.0} MiB at the end",
            s.cache_shrinks,
            s.cache_grows,
            s.budget_bytes as f64 / 1048576.0
        );
    }
    if s.predicted_routed > 0 {
        eprintln!(
            "prefetch: {} experts read ahead, {} misses served by them (overlap {}); prediction named {} of {} routed experts ({:.1}%)",
            s.prefetched,
            s.prefetch_used,
            pct(s.overlap_pct()),
            s.predicted_right,
            s.predicted_routed,
            100.0 * s.predicted_right as f64 / s.predicted_routed.max(1) as f64
        );
    }
    if d.tokens > 0 {
        eprintln!(
            "prefill-device: {} tokens, {} nodes, {:.1} MiB read ({:.1} MiB from the file, {} experts from the cache), stall {:.3} s, routed {}, demand {}, whole_fallback {}",
            d.tokens,
            d.nodes,
            d.read_mib(),
            d.file_read_mib(),
            d.cached_experts,
            d.stall_s,
            d.routed,
            d.demand,
            d.whole_fallback
        );
    }
}

/// Generates once and prints the text on stdout, the counters on stderr.
pub fn run_generate(a: GenerateArgs) -> anyhow::Result<()> {
    let opts = GenerateOptions {
        n_predict: a.n_predict,
        sampling: match a.seed {
            None => Sampling::Greedy,
            Some(seed) => Sampling::Seeded {
                seed,
                temperature: a.temp,
                top_k: a.top_k,
                top_p: a.top_p,
            },
        },
        chat: !a.raw,
    };
    opts.validate()?;
    let rss = crate::ident::RssPeaks::start();
    let (model, session) = load(&a.engine)?;
    if !a.raw && model.chat_template().is_none() {
        eprintln!("bmoe: the model has no chat template: the prompt goes in raw (as with --raw)");
    }
    let mut s = model.session(&session)?;
    let cancel = CancelToken::new();
    let c = cancel.clone();
    // Ctrl-C stops at the next token; the partial text is still printed.
    let _ = ctrlc::set_handler(move || c.cancel());
    let rec = s.generate(&a.prompt, &opts, &cancel)?;
    if a.engine.out.json() {
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(&rec.bytes)?;
        writeln!(out)?;
    }
    print_counters(&rec.timing, &rec.stream, &rec.prefill_dev);
    print_decode_stream(&rec);
    print_explain(&model);
    let (anon, file) = rss.peaks_mib();
    let mib = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "?".into());
    eprintln!(
        "storage: {:.2} MiB read per decoded token (all paths), peak RSS {} MiB (anonymous {} MiB, file-backed {} MiB), first token after {:.3} s",
        rec.decode_storage_read_bytes as f64 / 1048576.0 / f64::from(rec.timing.n_decoded.max(1)),
        mib(crate::ident::peak_rss_mib()),
        mib(anon),
        mib(file),
        rec.timing.first_token_s
    );
    match rec.stopped {
        bmoe_engine::StopReason::Cancelled => {
            eprintln!("cancelled after {} tokens", rec.tokens.len())
        }
        bmoe_engine::StopReason::ContextFull => eprintln!(
            "stopped: context full after {} tokens (context {})",
            rec.tokens.len(),
            s.n_ctx()
        ),
        _ => {}
    }
    Ok(())
}

/// Scores the choices once and prints `best` and each choice's score (and, with `--expected`,
/// whether the best is the expected one).
pub fn run_decide(a: DecideArgs) -> anyhow::Result<()> {
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
        let mut v = serde_json::to_value(&rec)?;
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

/// Scores a text file and prints its perplexity.
pub fn run_ppl(a: PplArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let (model, session) = load(&a.engine)?;
    let mut s = model.session(&session)?;
    let rec = s.perplexity(&text)?;
    if a.engine.out.json() {
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        println!(
            "perplexity: {:.4} +/- {:.4} (mean NLL {:.5} nats over {} tokens)",
            rec.ppl,
            rec.ppl * rec.nll_stderr,
            rec.nll_mean,
            rec.n_scored
        );
    }
    print_counters(&rec.timing, &rec.stream, &rec.prefill_dev);
    print_explain(&model);
    Ok(())
}
