//! `decide`: one prefill, no decode; each choice scored by its first token's log-probability over
//! the whole vocabulary.
use crate::error::{EngineError, Result};
use crate::options::DecideRequest;
use crate::telemetry::{DecideRecord, Timing};

use super::prefill::Outputs;
use super::Session;

/// Log-softmax of `logits` in f64 (max-shifted, so it never overflows).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&l| l as f64 - lse).collect()
}

impl Session<'_> {
    /// Scores `req.choices` after `prefix + suffix` rendered as one user message. Empty or
    /// colliding choices and a prompt longer than the context are refused before any prefill.
    pub fn decide(&mut self, req: &DecideRequest) -> Result<DecideRecord> {
        if req.choices.is_empty() {
            return Err(EngineError::NoChoices);
        }
        let vocab = self.model.raw.vocab();
        let mut firsts: Vec<i32> = Vec::with_capacity(req.choices.len());
        for (i, c) in req.choices.iter().enumerate() {
            let toks = vocab
                .tokenize(c, false, false)
                .map_err(EngineError::Tokenize)?;
            let Some(&first) = toks.first() else {
                return Err(EngineError::EmptyChoice {
                    index: i,
                    choice: c.clone(),
                });
            };
            if let Some(j) = firsts.iter().position(|&f| f == first) {
                return Err(EngineError::CollidingChoices {
                    first: j,
                    first_text: req.choices[j].clone(),
                    second: i,
                    second_text: c.clone(),
                    token: first,
                });
            }
            firsts.push(first);
        }
        let user = format!("{}{}", req.prefix, req.suffix);
        if user.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let text = self.model.render_user_message(&user)?;
        let tokens = self.model.tokenize(&text, true)?;
        if tokens.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong {
                n_prompt: tokens.len(),
                n_ctx: self.n_ctx,
                extra: String::new(),
            });
        }
        let (_exec, before) = self.begin();
        self.ctx.clear_memory()?;
        let prefill_s = self.prefill(&tokens, 0, Outputs::Last, |_, _, _| Ok(()))?;
        let logits = self
            .ctx
            .logits(-1, self.n_vocab)
            .ok_or_else(|| EngineError::Decode("no logits after prefill".into()))?;
        let lp = log_softmax(logits);
        let choice_logp: Vec<f64> = firsts.iter().map(|&t| lp[t as usize]).collect();
        let (stream_c, dev_c) = before.since(self.model);
        let best = choice_logp
            .iter()
            .enumerate()
            .fold(
                (0, f64::NEG_INFINITY),
                |acc, (i, &v)| if v > acc.1 { (i, v) } else { acc },
            )
            .0;
        Ok(DecideRecord {
            best,
            choice_logp,
            choice_tokens: firsts,
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
