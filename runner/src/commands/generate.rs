//! `bmoe generate`: load, generate once, print the text and the counters.
use std::io::Write;

use bmoe_engine::{CancelToken, GenerateOptions, Sampling};

use super::one_shot::{load, print_counters, print_decode_stream, print_explain, Doc, PeakRss};
use crate::cli::engine_args::GenerateArgs;

/// Generates once and prints the text on stdout, the counters on stderr.
pub fn generate(a: GenerateArgs) -> anyhow::Result<()> {
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
    // Measured once, for the document and the `storage:` line alike.
    let (anon, file) = rss.peaks_mib();
    let peak_mib = crate::ident::peak_rss_mib();
    let peak = PeakRss {
        mib: peak_mib,
        anon_mib: anon,
        file_mib: file,
    };
    if a.engine.out.json() {
        let doc = Doc {
            peak_rss: Some(peak),
            ..Doc::new(&rec, &model)
        };
        println!("{}", serde_json::to_string(&doc)?);
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(&rec.bytes)?;
        writeln!(out)?;
    }
    print_counters(&rec.timing, &rec.stream, &rec.prefill_dev);
    print_decode_stream(&rec);
    print_explain(&model);
    let mib = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "?".into());
    eprintln!(
        "storage: {:.2} MiB read per decoded token (all paths), peak RSS {} MiB (anonymous {} MiB, file-backed {} MiB), first token after {:.3} s",
        rec.decode_storage_read_bytes as f64 / 1048576.0 / f64::from(rec.timing.n_decoded.max(1)),
        mib(peak_mib),
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
