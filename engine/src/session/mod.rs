//! A session: one llama.cpp context over a model, and the calls that run on it (generate, decide,
//! perplexity). Each call starts from an empty KV cache.
mod decide;
mod generate;
mod perplexity;
mod prefill;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::ffi::context::{ContextParams, LlamaContext};
use crate::model::Model;
use crate::options::SessionOptions;

pub use decide::log_softmax;

/// A cancellation flag shared with whoever may stop a running call.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh, unset token.
    pub fn new() -> Self {
        Self::default()
    }
    /// Asks the running call to stop at the next token boundary.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    /// True once cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One context over a model.
pub struct Session<'m> {
    pub(crate) model: &'m Model,
    pub(crate) ctx: LlamaContext<'m>,
    pub(crate) opts: SessionOptions,
    pub(crate) n_ctx: usize,
    pub(crate) n_vocab: usize,
}

impl<'m> Session<'m> {
    pub(crate) fn new(model: &'m Model, opts: &SessionOptions) -> Result<Self> {
        if opts.threads == 0 {
            return Err(EngineError::InvalidOption(
                "threads must be at least 1".into(),
            ));
        }
        if opts.n_ubatch == 0 || opts.n_outputs_max == 0 {
            return Err(EngineError::InvalidOption(
                "n_ubatch and n_outputs_max must be at least 1".into(),
            ));
        }
        let n_ctx = if opts.n_ctx == 0 {
            model.info.n_ctx_train
        } else {
            opts.n_ctx
        };
        let n_ubatch = opts.n_ubatch.max(opts.n_ubatch_device).min(n_ctx.max(1));
        let ctx = LlamaContext::new(
            &model.raw,
            ContextParams {
                n_ctx,
                n_batch: n_ubatch,
                n_ubatch,
                n_outputs_max: opts.n_outputs_max.min(n_ubatch),
                threads: opts.threads,
                hook: None,
                abort: Arc::new(AtomicBool::new(false)),
            },
        )
        .map_err(|reason| EngineError::Context { reason })?;
        let n_ctx = ctx.n_ctx() as usize;
        Ok(Self {
            model,
            ctx,
            opts: opts.clone(),
            n_ctx,
            n_vocab: model.info.n_vocab as usize,
        })
    }

    /// The context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The model this session runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }
}
