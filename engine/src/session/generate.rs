//! `generate`: prefill the prompt, then decode one token at a time on the CPU.
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::sampler::Sampler;
use crate::options::{GenerateOptions, Sampling};
use crate::stream::trace::Phase;
use crate::telemetry::{GenerateRecord, StopReason, Timing};

use super::prefill::Outputs;
use super::{CancelToken, Session};

impl Session<'_> {
    /// Generates up to `opts.n_predict` tokens after `prompt`; stops at end-of-generation, when
    /// the context is full, or when `cancel` is set (the record's `stopped` says which). A prompt
    /// that does not fit the context is refused before anything runs.
    pub fn generate(
        &mut self,
        prompt: &str,
        opts: &GenerateOptions,
        cancel: &CancelToken,
    ) -> Result<GenerateRecord> {
        opts.validate()?;
        let called = Instant::now();
        let tokens = self.prompt_tokens(prompt, opts.chat)?;
        let mut sampler = sampler_for(&opts.sampling)?;
        let (mut exec, before) = self.begin();
        self.forget()?;
        self.model.set_stream_phase(Phase::Prompt)?;
        let mut rec = GenerateRecord::default();
        let prefill_s = self.prefill(&tokens, 0, Outputs::LastWide, &mut exec, |_, _, _| Ok(()))?;
        rec.timing = Timing {
            n_prompt: tokens.len() as u32,
            prefill_s,
            ..Timing::default()
        };
        let vocab = self.model.raw.vocab();
        let io0 = crate::telemetry::storage_read_bytes();
        let stream0 = self.model.stream_counters();
        self.model.set_stream_phase(Phase::Decode)?;
        let t0 = Instant::now();
        let mut batch = Batch::new(1);
        for pos in tokens.len()..tokens.len() + opts.n_predict as usize {
            if cancel.is_cancelled() {
                rec.cancelled = true;
                rec.stopped = StopReason::Cancelled;
                break;
            }
            let tok = sampler.sample(&self.ctx, -1)?;
            if vocab.is_eog(tok) {
                rec.stopped_eog = true;
                rec.stopped = StopReason::Eog;
                break;
            }
            rec.tokens.push(tok);
            if rec.tokens.len() == 1 {
                rec.timing.first_token_s = called.elapsed().as_secs_f64();
            }
            rec.bytes.extend(vocab.piece(tok, false)?);
            if rec.tokens.len() == opts.n_predict as usize {
                break;
            }
            // The token just sampled needs a cell of its own to be decoded from.
            if pos >= self.n_ctx {
                rec.stopped = StopReason::ContextFull;
                break;
            }
            batch.clear();
            batch.push(tok, pos as i32, true);
            self.run_batch(&batch, &mut exec)?;
        }
        self.model.set_stream_phase(Phase::Prompt)?;
        rec.timing.n_decoded = rec.tokens.len() as u32;
        rec.timing.decode_s = t0.elapsed().as_secs_f64();
        rec.decode_stream = self.model.stream_counters().since(&stream0);
        if let (Some(a), Some(b)) = (io0, crate::telemetry::storage_read_bytes()) {
            rec.decode_storage_read_bytes = b.saturating_sub(a);
        }
        rec.text = String::from_utf8_lossy(&rec.bytes).into_owned();
        (rec.stream, rec.prefill_dev) = before.since(self.model);
        Ok(rec)
    }

    /// The prompt's tokens (as a user message in the model's template with `chat`), refused
    /// when empty or longer than the context.
    fn prompt_tokens(&self, prompt: &str, chat: bool) -> Result<Vec<i32>> {
        let text = if chat {
            self.model.render_user_message(prompt)?
        } else {
            prompt.to_string()
        };
        let tokens = self.model.tokenize(&text, true)?;
        if tokens.is_empty() || prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if tokens.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong {
                n_prompt: tokens.len(),
                n_ctx: self.n_ctx,
                extra: String::new(),
            });
        }
        Ok(tokens)
    }
}

/// The sampler `sampling` asks for.
fn sampler_for(sampling: &Sampling) -> Result<Sampler> {
    Ok(match *sampling {
        Sampling::Greedy => Sampler::greedy()?,
        Sampling::Seeded {
            seed,
            temperature,
            top_k,
            top_p,
        } => Sampler::seeded(seed, temperature, top_k, top_p)?,
    })
}
