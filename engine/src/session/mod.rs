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

/// Cumulative counters at the start of a call, to report the call's own.
pub(crate) struct Snapshot {
    stream: crate::telemetry::StreamCounters,
    dev: crate::telemetry::PrefillDevCounters,
}

impl Snapshot {
    fn take(model: &Model) -> Self {
        Self {
            stream: model.stream_counters(),
            dev: model.prefill_dev_counters(),
        }
    }

    /// The call's streaming and device counters.
    pub(crate) fn since(
        &self,
        model: &Model,
    ) -> (
        crate::telemetry::StreamCounters,
        crate::telemetry::PrefillDevCounters,
    ) {
        (
            model.stream_counters().since(&self.stream),
            model.prefill_dev_counters().since(&self.dev),
        )
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
        let arena_active = match &model.arena {
            Some(a) => {
                let mut a = a
                    .lock()
                    .map_err(|_| EngineError::Device("the arena panicked earlier".into()))?;
                a.new_session();
                a.active_flag()
            }
            None => Arc::new(AtomicBool::new(false)),
        };
        let hook: Option<Box<dyn EvalHook>> = (model.stream.is_some() || model.arena.is_some())
            .then(|| {
                Box::new(EngineHook {
                    streamer: model.stream.clone(),
                    arena: model.arena.clone(),
                    arena_active: arena_active.clone(),
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
                // Only streamed models cut graphs at every routing node.
                persistent_threads: false,
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
    pub(crate) fn begin(&self) -> (std::sync::MutexGuard<'m, ()>, Snapshot) {
        let model: &'m Model = self.model;
        let guard = model.exec.lock().unwrap_or_else(|p| p.into_inner());
        (guard, Snapshot::take(model))
    }

    /// Runs one wide batch with every layer weight bound to the device arena, and back after.
    pub(crate) fn run_on_device(&mut self, batch: &Batch) -> Result<()> {
        let Some(arena) = self.model.arena.clone() else {
            return self.run_batch(batch);
        };
        let poisoned = |_| EngineError::Device("the arena panicked earlier".into());
        let began = arena.lock().map_err(poisoned)?.begin(batch.len() as u64);
        if let Err(e) = began {
            // Whatever was bound goes back to the host before the error is reported.
            let _ = arena.lock().map_err(poisoned)?.end();
            return Err(EngineError::Device(e));
        }
        let r = self.run_batch(batch);
        let end = arena.lock().map_err(poisoned)?.end();
        // The hook's own error (a skipped pacing point, a failed read) says more than the end's.
        r.map_err(|e| match e {
            EngineError::Stream(m) => EngineError::Device(m),
            e => e,
        })?;
        end.map_err(EngineError::Device)
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
