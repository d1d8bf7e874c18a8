//! A session: one llama.cpp context over a model, and the calls that run on it (generate, decide,
//! perplexity). Each call starts from an empty KV cache.
mod decide;
mod generate;
mod perplexity;
mod prefill;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::context::{ContextParams, DecodeStatus, EvalHook, LlamaContext};
use crate::hook::EngineHook;
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
    abort: Arc<AtomicBool>,
    hook_error: Arc<Mutex<Option<String>>>,
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
        let abort = Arc::new(AtomicBool::new(false));
        let hook_error = Arc::new(Mutex::new(None));
        let hook: Option<Box<dyn EvalHook>> = model.stream.as_ref().map(|st| {
            Box::new(EngineHook {
                streamer: st.clone(),
                abort: abort.clone(),
                error: hook_error.clone(),
            }) as Box<dyn EvalHook>
        });
        let ctx = LlamaContext::new(
            &model.raw,
            ContextParams {
                n_ctx,
                n_batch: n_ubatch,
                n_ubatch,
                n_outputs_max: opts.n_outputs_max.min(n_ubatch),
                threads: opts.threads,
                hook,
                abort: abort.clone(),
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
            abort,
            hook_error,
        })
    }

    /// Holds the model's execution lock for one call and snapshots the streaming counters.
    pub(crate) fn begin(
        &self,
    ) -> (
        std::sync::MutexGuard<'m, ()>,
        crate::telemetry::StreamCounters,
    ) {
        let model: &'m Model = self.model;
        let guard = model.exec.lock().unwrap_or_else(|p| p.into_inner());
        (guard, model.stream_counters())
    }

    /// Runs one batch; a stop requested by the hook (a failed expert read) becomes its error.
    pub(crate) fn run_batch(&mut self, batch: &Batch) -> Result<()> {
        self.abort.store(false, Ordering::Relaxed);
        if let Ok(mut e) = self.hook_error.lock() {
            *e = None;
        }
        let status = self.ctx.decode(batch).map_err(EngineError::Decode)?;
        let hook_err = self.hook_error.lock().ok().and_then(|mut e| e.take());
        self.abort.store(false, Ordering::Relaxed);
        match (status, hook_err) {
            (_, Some(msg)) => Err(EngineError::Stream(msg)),
            (DecodeStatus::Ok, None) => Ok(()),
            (DecodeStatus::Aborted, None) => Err(EngineError::Cancelled),
        }
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
