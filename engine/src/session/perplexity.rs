//! `perplexity`: teacher-forced log-likelihood of a text, in context-sized windows.
use crate::error::{EngineError, Result};
use crate::telemetry::{PerplexityRecord, Timing};

use super::decide::log_softmax;
use super::prefill::Outputs;
use super::Session;

impl Session<'_> {
    /// The logits of every position of `tokens` (one window from an empty KV cache); the building
    /// block of `perplexity`, public so a test can recompute it independently.
    pub fn eval_logits(&mut self, tokens: &[i32]) -> Result<Vec<Vec<f32>>> {
        if tokens.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong {
                n_prompt: tokens.len(),
                n_ctx: self.n_ctx,
                extra: String::new(),
            });
        }
        let (mut exec, _) = self.begin();
        self.forget()?;
        let mut rows = Vec::with_capacity(tokens.len());
        self.prefill(tokens, 0, Outputs::All, &mut exec, |s, start, end| {
            for i in 0..(end - start) {
                let l = s
                    .ctx
                    .logits(i as i32)
                    .ok_or_else(|| EngineError::NoLogits(format!("for row {}", start + i)))?;
                rows.push(l.to_vec());
            }
            Ok(())
        })?;
        Ok(rows)
    }

    /// exp(mean NLL) of `text` (BOS added where the model asks), each window of `n_ctx` tokens
    /// scored from an empty KV cache; the first token of each window is context only.
    pub fn perplexity(&mut self, text: &str) -> Result<PerplexityRecord> {
        let tokens = self.model.tokenize(text, true)?;
        if tokens.len() < 2 {
            return Err(EngineError::InvalidOption(format!(
                "perplexity needs a text of at least 2 tokens, this one has {}",
                tokens.len()
            )));
        }
        let (mut exec, before) = self.begin();
        let mut nll = 0.0f64;
        // Squares too, for the standard error llama-perplexity prints beside its estimate.
        let mut nll2 = 0.0f64;
        let mut n_scored = 0u32;
        let mut prefill_s = 0.0;
        for window in tokens.chunks(self.n_ctx) {
            if window.len() < 2 {
                continue;
            }
            self.forget()?;
            let mut next = 1usize;
            prefill_s += self.prefill(window, 0, Outputs::All, &mut exec, |s, start, end| {
                for i in start..end {
                    if i + 1 >= window.len() {
                        break;
                    }
                    let l = s
                        .ctx
                        .logits((i - start) as i32)
                        .ok_or_else(|| EngineError::NoLogits(format!("for row {i}")))?;
                    let lp = log_softmax(l)[window[i + 1] as usize];
                    nll -= lp;
                    nll2 += lp * lp;
                    n_scored += 1;
                    next = i + 2;
                }
                Ok(())
            })?;
            debug_assert_eq!(next, window.len());
        }
        let nll_mean = nll / f64::from(n_scored);
        let nll_stderr = nll_mean_stderr(nll, nll2, n_scored);
        let (stream_c, dev_c) = before.since(self.model);
        Ok(PerplexityRecord {
            ppl: nll_mean.exp(),
            nll_mean,
            nll_stderr,
            n_scored,
            n_tokens: tokens.len() as u32,
            timing: Timing {
                n_prompt: tokens.len() as u32,
                prefill_s,
                ..Timing::default()
            },
            stream: stream_c,
            prefill_dev: dev_c,
        })
    }
}

/// The standard error of the mean NLL over `n` tokens from the sums of NLL and NLL squared, as
/// llama.cpp's perplexity tool computes it (`sqrt((E[x^2] - E[x]^2) / (n - 1))`); 0 below 2 tokens.
fn nll_mean_stderr(sum: f64, sum_sq: f64, n: u32) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let n = f64::from(n);
    let mean = sum / n;
    ((sum_sq / n - mean * mean).max(0.0) / (n - 1.0)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::nll_mean_stderr;

    #[test]
    fn the_stderr_is_llama_perplexitys() {
        // NLLs 1, 2, 3: mean 2, E[x^2] 14/3, variance 2/3, over n - 1 = 2: sqrt(1/3).
        let se = nll_mean_stderr(6.0, 14.0, 3);
        assert!((se - (1.0f64 / 3.0).sqrt()).abs() < 1e-12, "{se}");
        assert_eq!(nll_mean_stderr(2.0, 4.0, 1), 0.0);
    }
}
