//! What a run did: rows written per CSV, items skipped and refused, the totals of its rows.

use serde::Serialize;

use crate::config::item::Kind;
use crate::sink::row::Row;

/// Rows written to one CSV.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Written {
    /// The file, as the user would name it.
    pub csv: String,
    /// Rows appended.
    pub rows: u64,
}

/// What a run did.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// The run id.
    pub run_id: String,
    /// This process's shard (`K/N`), when sharded.
    pub shard: Option<String>,
    /// Rows written, per CSV.
    pub written: Vec<Written>,
    /// Items skipped because the run already had them.
    pub skipped: u64,
    /// Rows whose item the engine refused.
    pub failed: u64,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
    /// Decide rows that succeeded.
    pub decisions: u64,
    /// Of those, the ones whose decision carries an expected answer.
    pub with_expected: u64,
    /// Of those, the ones whose best choice is the expected one.
    pub correct: u64,
    /// `correct / with_expected`; `None` when no decision carries an expected answer.
    pub accuracy: Option<f64>,
    /// Sum of prefill seconds.
    pub prefill_s: f64,
    /// Sum of prefilled tokens (without the prefix tokens decisions reused).
    pub prefill_tokens: u64,
    /// generate: tokens decoded, over the rows without an error.
    pub decode_tokens: u64,
    /// generate: seconds spent decoding them.
    pub decode_s: f64,
    /// perplexity: tokens scored, over the rows without an error.
    pub ppl_tokens: u64,
    /// perplexity: the sum of their negative log-likelihoods (nats).
    pub nll_sum: f64,
    /// perplexity: the sum of their squares.
    pub nll_sq_sum: f64,
    /// perplexity: the standard error of `ppl` (`ppl` times the mean NLL's standard error, as
    /// llama-perplexity prints `+/-`).
    pub ppl_stderr: Option<f64>,
    /// perplexity: exp(nll_sum / ppl_tokens), as llama-perplexity pools a whole text; `None`
    /// when nothing was scored.
    pub ppl: Option<f64>,
}

impl Summary {
    /// Counts what a row of any kind measured: decode tokens and time, scored tokens and NLL.
    pub(super) fn add_outcome(&mut self, row: &Row) {
        if !row.error.is_empty() {
            return;
        }
        if row.tokens > 0 {
            self.decode_tokens += u64::from(row.tokens);
            self.decode_s += row.decode_s;
        }
        if let (Some(n), Some(nll)) = (row.n_scored, row.nll_mean) {
            let n_f = f64::from(n);
            self.ppl_tokens += u64::from(n);
            self.nll_sum += nll * n_f;
            // The sum of squares back from the row's mean and standard error (its variance is
            // stderr^2 (n - 1)), so texts pool as one would.
            let se = row.nll_stderr.unwrap_or(0.0);
            self.nll_sq_sum += n_f * (se * se * (n_f - 1.0).max(0.0) + nll * nll);
        }
    }
}

/// Adds a written row to the run's totals.
pub(super) fn count_row(summary: &mut Summary, kind: Kind, row: &Row) {
    if kind == Kind::Decide && row.error.is_empty() {
        summary.decisions += 1;
        if let Some(ok) = row.correct {
            summary.with_expected += 1;
            summary.correct += u64::from(ok);
        }
    }
    summary.add_outcome(row);
    summary.prefill_s += row.prefill_s;
    summary.prefill_tokens += u64::from(row.n_prefilled.unwrap_or(row.n_prompt));
}

/// The totals computed from the sums: accuracy, perplexity and its standard error.
pub(super) fn finish_totals(summary: &mut Summary) {
    summary.accuracy =
        (summary.with_expected > 0).then(|| summary.correct as f64 / summary.with_expected as f64);
    summary.ppl =
        (summary.ppl_tokens > 0).then(|| (summary.nll_sum / summary.ppl_tokens as f64).exp());
    summary.ppl_stderr = summary.ppl.map(|ppl| {
        let n = summary.ppl_tokens as f64;
        let mean = summary.nll_sum / n;
        let var = (summary.nll_sq_sum / n - mean * mean).max(0.0);
        ppl * if n > 1.0 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    });
}
