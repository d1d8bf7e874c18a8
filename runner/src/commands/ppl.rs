//! `bmoe ppl`: load, score a text file, print its perplexity.
use anyhow::Context;

use super::one_shot::{load, print_counters, print_explain, Doc};
use crate::cli::engine_args::PplArgs;

/// Scores a text file and prints its perplexity.
pub fn ppl(a: PplArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let (model, session) = load(&a.engine)?;
    let mut s = model.session(&session)?;
    let rec = s.perplexity(&text)?;
    if a.engine.out.json() {
        println!("{}", serde_json::to_string(&Doc::new(&rec, &model))?);
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
