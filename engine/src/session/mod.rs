//! A session: one llama.cpp context over a model, and the calls that run on it (generate, decide,
//! perplexity). Each call starts from an empty KV cache.
pub(crate) mod decide;
mod disk;
mod generate;
mod hook;
mod memory_home;
mod perplexity;
mod prefill;
mod reuse;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::device::DeviceError;
use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::context::{ContextParams, DecodeStatus, EvalHook, LlamaContext};
use crate::model::Model;
use crate::options::SessionOptions;
use crate::weights::ExecGuard;
use hook::EngineHook;

pub use decide::log_softmax;
pub use memory_home::MovedMemoryInfo;

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

/// Sequences a context holds: the prompt's (0) and up to `SEQS - 1` choices scored side by side.
pub(crate) const SEQS: u32 = 16;

/// Piece widths a session really uses, after llama.cpp clamped its batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Widths {
    /// Widest CPU piece.
    pub(crate) cpu: u32,
    /// Widest device piece.
    pub(crate) device: u32,
    /// Most logit rows per piece.
    pub(crate) outputs: u32,
    /// Width of a prompt's CPU pieces when only its last row is read (decisions, generate): the
    /// CPU width, at most `prefill::PROMPT_GRID`, so prefix reuse keeps nearly all of a shared
    /// prefix and still computes the pieces a fresh prefill computes.
    pub(crate) grid: u32,
}

/// One context over a model.
pub struct Session<'m> {
    pub(crate) model: &'m Model,
    pub(crate) ctx: LlamaContext<'m>,
    pub(crate) widths: Widths,
    threads: crate::settings::ThreadChoice,
    /// The tokens sequence 0 of the KV cache holds, at positions 0.. (prefix reuse).
    pub(crate) kv: Vec<i32>,
    /// The logits after the last token of `kv`, while no other decode has replaced them.
    pub(crate) last_logits: Vec<f32>,
    pub(crate) prefix_reuse: crate::options::PrefixReuse,
    /// Sequence 0's state saved at a boundary the next prompts are expected to repeat, for a
    /// memory that cannot keep a prefix by dropping the rest (sliding window, recurrent).
    pub(crate) saved: Option<reuse::Snapshot>,
    /// Whether decisions save such states: the model has a sliding window or a recurrent state,
    /// or the memory once refused a partial removal.
    pub(crate) snapshots: bool,
    /// The memory keeps one recurrent state per sequence: a sequence copied from another holds
    /// all of it, never a range of positions.
    pub(crate) recurrent: bool,
    /// Prefix states on disk and this session's whole key for them (a plain KV cache only).
    pub(crate) disk: Option<(crate::options::PrefixCache, String)>,
    /// Whether the compute buffers were reserved again with the weights on the prefill device
    /// (at this session's first device graph).
    device_reserved: bool,
    pub(crate) n_ctx: usize,
    /// The KV cache and recurrent state, when moved into the prefill device's host buffer type
    /// (after `ctx`: dropped once the context is gone).
    pub(crate) memory: Option<crate::ffi::kv::MovedMemory>,
    abort: Arc<AtomicBool>,
    hook_error: Arc<Mutex<Option<EngineError>>>,
}

impl Model {
    /// Opens a session (a llama.cpp context) on this model.
    pub fn session(&self, opts: &SessionOptions) -> Result<Session<'_>> {
        Session::new(self, opts)
    }
}

/// The hook llama.cpp calls for every node, when the model streams experts, has an arena, or
/// moves its KV cache: the arena is told a session opened.
fn engine_hook(
    model: &Model,
    abort: &Arc<AtomicBool>,
    hook_error: &Arc<Mutex<Option<EngineError>>>,
    memory_capture: &Arc<memory_home::MemoryCapture>,
) -> Result<Option<Box<dyn EvalHook>>> {
    let arena_active = match &model.arena {
        Some(a) => {
            let mut a = a
                .lock()
                .map_err(|_| EngineError::Device(DeviceError::Poisoned))?;
            a.new_session();
            a.active_flag()
        }
        None => Arc::new(AtomicBool::new(false)),
    };
    if model.stream.is_none() && model.arena.is_none() && model.kv_home.is_none() {
        return Ok(None);
    }
    Ok(Some(Box::new(EngineHook {
        streamer: model.stream.clone(),
        arena: model.arena.clone(),
        arena_active,
        memory: memory_capture.clone(),
        abort: abort.clone(),
        error: hook_error.clone(),
    })))
}

/// The context a session enforces: the one asked for (the model's training context for 0).
/// llama.cpp clamps its batch to that request and then pads the allocation up to a multiple of
/// 256; every piece stays within the clamped batch, so none can reach llama.cpp's
/// `n_tokens_all <= n_batch` assert, and every length check uses the request.
fn requested_ctx(model: &Model, opts: &SessionOptions) -> u32 {
    if opts.n_ctx == 0 {
        model.info.n_ctx_train.max(1)
    } else {
        opts.n_ctx
    }
}

impl Widths {
    /// The widths `opts` asks for, within the `batch` llama.cpp took. Stock llama.cpp has no
    /// grid: every prompt is cut at the batch width, as llama.cpp cuts it.
    fn within(opts: &SessionOptions, batch: u32, stock: bool) -> Self {
        let cpu = opts.n_ubatch.min(batch);
        Widths {
            cpu,
            device: opts.n_ubatch_device.min(batch),
            outputs: opts.n_outputs_max.min(batch),
            grid: if stock {
                cpu
            } else {
                cpu.min(prefill::PROMPT_GRID)
            },
        }
    }
}

/// Where the prefix state goes on disk, and its key for these widths; none where the model keeps
/// snapshots (sliding windows, recurrent state) or prefix reuse is off.
fn prefix_disk(
    opts: &SessionOptions,
    widths: &Widths,
    snapshots: bool,
) -> Option<(crate::options::PrefixCache, String)> {
    opts.prefix_cache
        .clone()
        .filter(|_| !snapshots && opts.prefix_reuse != crate::options::PrefixReuse::Off)
        .map(|c| {
            let w = format!("grid {} device {}", widths.grid, widths.device);
            let key = disk::full_key(&c, &w);
            (c, key)
        })
}

impl<'m> Session<'m> {
    /// Opens a session on `model`: its context, its KV cache moved where the prefill device
    /// computes on it, and the widths its pieces run at.
    pub(crate) fn new(model: &'m Model, opts: &SessionOptions) -> Result<Self> {
        opts.validate(model.prefill.as_ref())?;
        // ggml's compute threads spin at barriers: more of them than the cores this process may
        // use make every graph crawl, so the count is capped here whatever the front end did.
        let threads = crate::settings::ThreadChoice::resolve(
            Some(opts.threads),
            crate::settings::usable_cores(),
        );
        let n_ctx = requested_ctx(model, opts);
        // At least 2: llama.cpp sizes its sequences by the batch (`n_seq` below), and the
        // whole-choice scorings need sequence 1 beside the prompt's; with `cpu_ubatch = 1` the
        // pieces stay one row wide (`widths.cpu`), so no graph changes shape.
        let n_ubatch = opts.n_ubatch.max(opts.n_ubatch_device).max(2).min(n_ctx);
        let n_seq = SEQS.min(n_ubatch).max(1);
        let abort = Arc::new(AtomicBool::new(false));
        let hook_error = Arc::new(Mutex::new(None));
        let memory_capture = Arc::new(memory_home::MemoryCapture::default());
        let hook = engine_hook(model, &abort, &hook_error, &memory_capture)?;
        // Sliding-window layers get the window's cells only, as llama.cpp's own tools do: a long
        // context costs them no more memory than their window. Prefix reuse restores a saved
        // state where the window has dropped cells a kept prefix needs (reuse.rs).
        let ctx = LlamaContext::with_swa_cache(
            &model.raw,
            ContextParams {
                n_ctx,
                n_batch: n_ubatch,
                n_ubatch,
                // llama.cpp reserves a decode graph with one token and one output per sequence:
                // both the batch and the output cap must hold `n_seq` of them.
                n_outputs_max: opts.n_outputs_max.min(n_ubatch).max(n_seq),
                threads: threads.used,
                // One set of compute threads for the session's life: ggml otherwise starts and
                // joins its workers for every graph, and a streamed decode is cut into one graph
                // per routing node. Between graphs the workers poll briefly (ggml's default), so
                // the next graph finds them awake.
                persistent_threads: !model.stock,
                cpus: opts.cpus.clone(),
                n_seq_max: n_seq,
                hook,
                abort: abort.clone(),
            },
            false,
        )
        .map_err(EngineError::Context)?;
        let mut ctx = ctx;
        let memory = model
            .kv_home
            .map(|buft| memory_home::move_memory(model, &mut ctx, &memory_capture, buft))
            .transpose()?;
        // What llama.cpp really took: pieces never exceed its batch, whatever it clamped.
        let batch = ctx.n_batch().min(ctx.n_ubatch()).max(1);
        let n_ctx = (n_ctx as usize).min(ctx.n_ctx() as usize);
        let widths = Widths::within(opts, batch, model.stock);
        let snapshots = model.raw.n_swa() > 0 || model.raw.has_recurrent_state();
        let disk = prefix_disk(opts, &widths, snapshots).filter(|_| !model.stock);
        Ok(Self {
            model,
            ctx,
            widths,
            disk,
            threads,
            kv: Vec::new(),
            last_logits: Vec::new(),
            // Stock llama.cpp keeps nothing between calls: every decision prefills its prompt.
            prefix_reuse: match model.stock {
                true => crate::options::PrefixReuse::Off,
                false => opts.prefix_reuse,
            },
            saved: None,
            snapshots,
            recurrent: model.raw.has_recurrent_state(),
            device_reserved: false,
            n_ctx,
            memory,
            abort,
            hook_error,
        })
    }

    /// Holds the model's execution lock for one call and snapshots the streaming counters.
    pub(crate) fn begin(&self) -> (ExecGuard<'m>, Snapshot) {
        let model: &'m Model = self.model;
        (model.raw.exec().lock(), Snapshot::take(model))
    }

    /// Runs one wide batch with every layer weight bound to the device arena, and back after.
    pub(crate) fn run_on_device(&mut self, batch: &Batch, exec: &mut ExecGuard<'_>) -> Result<()> {
        let Some(arena) = self.model.arena.clone() else {
            return self.run_batch(batch, exec);
        };
        let poisoned = |_| EngineError::Device(DeviceError::Poisoned);
        // What the expert cache holds goes to the device from memory; the streamer does not run
        // during a wide graph, so this stays true until it ends.
        let cached = match &self.model.stream {
            Some(s) => s
                .lock()
                .map_err(|_| EngineError::Stream(crate::stream::StreamError::Poisoned))?
                .cached_experts(),
            None => Default::default(),
        };
        let began =
            arena
                .lock()
                .map_err(poisoned)?
                .begin(batch.len() as u64, cached, &mut exec.quiet());
        if let Err(e) = began {
            // Whatever was bound goes back to the host before the error is reported.
            let _ = arena.lock().map_err(poisoned)?.end(&mut exec.quiet());
            return Err(EngineError::Device(e));
        }
        // llama.cpp reserved the compute buffers at creation with every weight on the CPU, so the
        // CPU's buffer was sized for the widest piece computed there. Reserved again now, with the
        // weights in the arena, the wide graph's buffers go to the device and the CPU's holds its
        // own share; narrower CPU pieces and decode grow it to what they need.
        let keep_first = self
            .model
            .prefill
            .as_ref()
            .is_some_and(|p| p.gate().keep_first_reserve);
        if !self.device_reserved && !keep_first {
            self.ctx.reserve_at_next_decode();
            self.device_reserved = true;
        }
        let r = self.run_batch(batch, exec);
        let end = arena.lock().map_err(poisoned)?.end(&mut exec.quiet());
        // The hook's own error (a skipped pacing point, a failed read) says more than the end's.
        r?;
        end.map_err(EngineError::Device)
    }

    /// Runs one batch; a stop requested by the hook (a failed expert read) becomes its error.
    pub(crate) fn run_batch(&mut self, batch: &Batch, exec: &mut ExecGuard<'_>) -> Result<()> {
        self.abort.store(false, Ordering::Relaxed);
        if let Ok(mut e) = self.hook_error.lock() {
            *e = None;
        }
        let status = match self.ctx.decode(batch, exec) {
            Ok(s) => s,
            Err(e @ crate::ffi::error::FfiError::MappedRead(_)) => {
                // The cache holds what was computed from a zeroed weight page: nothing of it may
                // be reused by the next call.
                let _ = self.forget();
                return Err(EngineError::Decode(e));
            }
            Err(e) => return Err(EngineError::Decode(e)),
        };
        let hook_err = self.hook_error.lock().ok().and_then(|mut e| e.take());
        self.abort.store(false, Ordering::Relaxed);
        match (status, hook_err) {
            (_, Some(e)) => Err(e),
            (DecodeStatus::Ok, None) => Ok(()),
            (DecodeStatus::Aborted, None) => Err(EngineError::Cancelled),
        }
    }

    /// The context size in tokens this session enforces (what was asked, or the model's
    /// training context for 0).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Prefills `tokens` as the start of the next decision's prompt, as if an earlier call had
    /// left them in the cache (a warm-up, and how gate G18a feeds a prompt in two pieces).
    pub fn prime(&mut self, tokens: &[i32]) -> Result<()> {
        let (mut exec, _) = self.begin();
        self.forget()?;
        if tokens.is_empty() {
            return Ok(());
        }
        self.prefill(tokens, 0, prefill::Outputs::Last, &mut exec, |_, _, _| {
            Ok(())
        })?;
        self.kv = tokens.to_vec();
        self.last_logits = self
            .ctx
            .logits(-1)
            .ok_or_else(|| EngineError::NoLogits("after prefill".into()))?
            .to_vec();
        Ok(())
    }

    /// Compute threads as asked and as used (capped to the usable cores).
    pub fn threads(&self) -> crate::settings::ThreadChoice {
        self.threads
    }

    /// Where the KV cache and recurrent state were moved when the session opened (the prefill
    /// device's host buffer type), if they were.
    pub fn moved_memory(&self) -> Option<MovedMemoryInfo> {
        self.memory.as_ref().map(MovedMemoryInfo::of)
    }

    /// The model this session runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }
}
