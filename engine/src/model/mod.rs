//! The loaded model and what it reports about itself; the load's phases are in `load.rs`, the
//! devices it places in `place.rs`, and what it tells the user in `warning.rs`.
mod load;
mod place;
mod warning;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
use crate::ffi::buffer::BufferType;
use crate::ffi::model::LlamaModel;
use crate::options::LoadOptions;
use crate::stream::lean_load::DenseMaps;
use crate::stream::Streamer;
use crate::telemetry::LoadStats;

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelInfo {
    /// The file loaded.
    pub path: PathBuf,
    /// Bytes on disk (all shards).
    pub file_bytes: u64,
    /// `general.architecture`.
    pub arch: String,
    /// llama.cpp's description.
    pub desc: String,
    /// Layers.
    pub n_layer: u32,
    /// Embedding width.
    pub n_embd: u32,
    /// Vocabulary size.
    pub n_vocab: u32,
    /// Training context.
    pub n_ctx_train: u32,
    /// Experts per MoE layer (0 for dense models).
    pub n_expert: u32,
    /// Experts used per token, after any override (0 for dense models).
    pub n_expert_used: u32,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Whether the model carries a chat template.
    pub has_chat_template: bool,
    /// The prefill device that joined the run, if one was asked for and opened.
    pub prefill_device: Option<String>,
}

/// What a load that read no expert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeanLoadInfo {
    /// Bytes of dense weights bound to the engine's own mapping of the file.
    pub dense_bytes: u64,
    /// Optional tensors the architecture created that the file lacks and the graph still reads,
    /// bound to the value that makes their op an identity (zeros for a bias, ones for a scale).
    pub neutral_tensors: usize,
    /// References to such tensors cleared from the model's layers, so that the graph leaves
    /// their ops out as after llama.cpp's own load; `None` when the engine declined to (the
    /// neutral values then stand in for all of them).
    pub unlinked_tensors: Option<usize>,
}

/// A loaded model; sessions borrow it.
pub struct Model {
    // Dropped first: its regions back tensors of `raw`, which must not be computed on afterwards.
    pub(crate) stream: Option<Arc<Mutex<Streamer>>>,
    /// The prefill arena, when a device runs wide graphs (dropped before the model too).
    pub(crate) arena: Option<Arc<Mutex<crate::device::arena::Arena>>>,
    /// The prefill settings, when a device joined (sessions check their widths against them).
    pub(crate) prefill: Option<crate::options::PrefillOptions>,
    /// Where sessions move their KV cache and recurrent state (the prefill device's host buffer
    /// type), when the device computes on it.
    pub(crate) kv_home: Option<BufferType>,
    /// Pieces at least this wide run on the prefill device.
    pub(crate) prefill_min_tokens: usize,
    pub(crate) raw: LlamaModel,
    /// Loaded as stock llama.cpp ([`LoadOptions::stock`]): its sessions run as llama.cpp does.
    pub(crate) stock: bool,
    // After `raw`: the dense weights of a streamed load point into these mappings.
    dense_maps: Option<DenseMaps>,
    pub(crate) info: ModelInfo,
    pub(crate) template: Option<String>,
    warnings: Vec<String>,
    load_stats: LoadStats,
}

impl Model {
    /// Loads a model as `opts` says, for sessions of the default shape ([`Model::load_for`]).
    pub fn load(opts: &LoadOptions) -> Result<Model> {
        Self::load_for(opts, &crate::options::SessionOptions::default())
    }

    /// Loads a model as `opts` says: the file checked, the devices placed, llama.cpp's model
    /// (lean or whole), the capture and weight table, then the streamer and the arena. An `auto`
    /// expert cache is planned for sessions of `session`'s shape (its context, batch and output
    /// rows size the KV cache and compute buffers the cache leaves room for).
    pub fn load_for(opts: &LoadOptions, session: &crate::options::SessionOptions) -> Result<Model> {
        load::Loader::open(opts, load::PlanSource::ThisMachine(session, None))?.load()
    }

    /// [`Model::load_for`] with the prefill place already decided ([`crate::plan::PrefillPlace`]:
    /// the device resolved, and opened, by the caller): the load takes it as it is.
    pub fn load_for_placed(
        opts: &LoadOptions,
        session: &crate::options::SessionOptions,
        prefill: &crate::plan::PrefillPlace,
    ) -> Result<Model> {
        load::Loader::open(opts, load::PlanSource::ThisMachine(session, Some(prefill)))?.load()
    }

    /// Loads a model as `opts` says, on a plan made before ([`crate::plan`], e.g. against a
    /// profile's RAM): its prefill place is taken as decided (the device it resolved is not
    /// opened again, and a device its caller's policy refused stays refused) and an `auto`
    /// expert cache is its `cache_mb`.
    pub fn load_planned(opts: &LoadOptions, plan: &crate::plan::Plan) -> Result<Model> {
        load::Loader::open(opts, load::PlanSource::Given(plan))?.load()
    }

    /// What was loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Things the user should know about this load (a cache below the cliff, no O_DIRECT, where
    /// prefill runs).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The device-prefill profiling report since the last call (`explain`); `None` when the
    /// mode is off or no device joined.
    pub fn explain_prefill(&self) -> Option<crate::device::explain::ExplainReport> {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().and_then(|mut a| a.take_explain()))
    }

    /// Cumulative expert-streaming counters (zero when not streaming).
    pub fn stream_counters(&self) -> crate::telemetry::StreamCounters {
        self.stream
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.counters()))
            .unwrap_or_default()
    }

    /// Tells the expert streamer whether what runs next is a prompt or decode (its routing
    /// trace records it); at the end of a decode, writes out what the trace has buffered.
    pub fn set_stream_phase(&self, phase: crate::stream::trace::Phase) -> crate::error::Result<()> {
        let Some(s) = &self.stream else {
            return Ok(());
        };
        let mut s = s
            .lock()
            .map_err(|_| EngineError::Stream(crate::stream::StreamError::Poisoned))?;
        s.set_phase(phase);
        if phase == crate::stream::trace::Phase::Prompt {
            s.flush_trace().map_err(EngineError::Stream)?;
        }
        Ok(())
    }

    /// Changes the lossy routing knobs of a streamed model between calls, checked against their
    /// ranges: a gate warms the cache with them off, then turns them on (engine tests only).
    #[cfg(feature = "test-support")]
    pub fn set_lossy(&self, expert_substitute: f64, drop_cold: f64) -> crate::error::Result<()> {
        let knobs = crate::stream::lossy::Knobs {
            substitute: crate::settings::EXPERT_SUBSTITUTE.check(expert_substitute)?,
            drop_cold: crate::settings::DROP_COLD.check(drop_cold)?,
        };
        if let Some(s) = &self.stream {
            if let Ok(mut s) = s.lock() {
                s.set_knobs(knobs);
            }
        }
        Ok(())
    }

    /// Cumulative prefill-device counters (zero when no device runs graphs).
    pub fn prefill_dev_counters(&self) -> crate::telemetry::PrefillDevCounters {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().map(|a| a.counters()))
            .unwrap_or_default()
    }

    /// How the prefill arena laid the model out, when a device runs wide graphs.
    pub fn arena_layout(&self) -> Option<crate::device::arena::ArenaLayout> {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().map(|a| a.layout()))
    }

    /// What the load cost and how it ran.
    pub fn load_stats(&self) -> LoadStats {
        self.load_stats
    }

    /// How a streamed model loaded without reading its experts (`None`: llama.cpp's load ran).
    pub fn lean_load(&self) -> Option<LeanLoadInfo> {
        self.dense_maps.as_ref().map(|m| LeanLoadInfo {
            dense_bytes: m.dense_bytes(),
            neutral_tensors: m.n_neutral(),
            unlinked_tensors: m.unlinked(),
        })
    }

    /// The expert cache budget in bytes (0 = none), when streaming.
    pub fn stream_budget_bytes(&self) -> Option<u64> {
        self.stream
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.budget_bytes()))
    }

    /// Tokenizes `text` (BOS added where the model asks for it).
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<i32>> {
        self.raw
            .vocab()
            .tokenize(text, add_special, add_special)
            .map_err(EngineError::Tokenize)
    }

    /// The bytes a token sequence stands for.
    pub fn detokenize(&self, tokens: &[i32]) -> Result<Vec<u8>> {
        Ok(self.raw.vocab().detokenize(tokens, false)?)
    }

    /// The chat template, if the model carries one.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// Renders `user` as one user message with the model's template, reasoning off where the
    /// template has a thinking block; the text unchanged when the model has no usable template.
    pub fn render_user_message(&self, user: &str) -> Result<String> {
        crate::chat::render_user_message(self.template.as_deref(), user)
    }
}
