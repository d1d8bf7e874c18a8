//! The engine's typed errors: each says what went wrong in words a user can act on.
use std::path::PathBuf;
use std::sync::Arc;

use crate::ffi::error::FfiError;

/// Everything the engine can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model path does not exist.
    #[error("model file {path} does not exist")]
    ModelMissing { path: PathBuf },
    /// The model path exists but cannot be read.
    #[error("model file {path} cannot be read: {source}")]
    ModelUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a GGUF at all.
    #[error("{path} is not a GGUF file (it starts with {magic:?}, a GGUF starts with \"GGUF\")")]
    NotGguf { path: PathBuf, magic: String },
    /// llama.cpp refused the file; `reason` is what it logged.
    #[error("cannot load {path}: {reason}")]
    ModelLoad { path: PathBuf, reason: String },
    /// A split GGUF is missing one of its shards.
    #[error("split GGUF {path}: shard {shard} of {count} is missing ({missing})")]
    MissingShard {
        path: PathBuf,
        shard: u32,
        count: u32,
        missing: PathBuf,
    },
    /// Context creation failed.
    #[error("could not create a llama.cpp context: {0}")]
    Context(#[source] FfiError),
    /// The prompt does not fit in the context.
    #[error("the prompt is {n_prompt} tokens{extra}, the context holds {n_ctx}: shorten it or raise the context size")]
    PromptTooLong {
        n_prompt: usize,
        n_ctx: usize,
        extra: String,
    },
    /// The prompt tokenized to nothing.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A decision with no choices.
    #[error("a decision needs at least one choice; the choice list is empty")]
    NoChoices,
    /// A choice that tokenizes to nothing.
    #[error("choice {index} ({choice:?}) is empty after tokenization")]
    EmptyChoice { index: usize, choice: String },
    /// `calibrated` scoring on a vocabulary with neither a BOS nor an EOS token.
    #[error("scoring = \"calibrated\" scores each choice after a neutral context of the BOS (else EOS) token, and this model's vocabulary has neither; use scoring = \"sum\" or \"norm\"")]
    NoNeutralContext,
    /// Two choices start with the same token, so their first-token scores cannot tell them apart.
    #[error("choices {first} ({first_text:?}) and {second} ({second_text:?}) start with the same token {token}: first-token scoring cannot tell them apart; use scoring = \"sum\" (or --scoring sum)")]
    CollidingChoices {
        first: usize,
        first_text: String,
        second: usize,
        second_text: String,
        token: i32,
    },
    /// Tokenization failed.
    #[error("tokenization failed: {0}")]
    Tokenize(#[source] FfiError),
    /// `llama_decode` failed (an error code, or an exception).
    /// Moving a weight (onto the streamer's memory, a file mapping or a neutral value) failed.
    #[error("moving a weight: {0}")]
    Weight(#[source] FfiError),
    #[error("decode failed: {0}")]
    Decode(#[source] FfiError),
    /// The memory refused to drop a prompt piece's padding rows (their first position named).
    #[error(
        "the memory kept the padding after a prompt piece at position {0}; the cache was cleared"
    )]
    PaddingKept(usize),
    /// A decode left no logits where the call needs them (the row named).
    #[error("decode failed: no logits {0}")]
    NoLogits(String),
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The model's architecture cannot use a requested mechanism.
    #[error("{0}")]
    Unsupported(String),
    /// Expert streaming failed (a read error, a short read); the decode was stopped.
    #[error("expert streaming: {0}")]
    Stream(#[source] StreamError),
    /// The prefill device failed (arena binding, a skipped pacing point).
    #[error("prefill device: {0}")]
    Device(#[source] DeviceError),
    /// The graph hook's lock was poisoned by an earlier panic.
    #[error("the graph hook panicked earlier")]
    HookPoisoned,
    /// Reading from the model file failed.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// llama.cpp threw a C++ exception, caught at the boundary (a damaged vocabulary, say).
    #[error(transparent)]
    Thrown(#[from] crate::ffi::guard::Thrown),
    /// The file fails a check made before llama.cpp sees it: `what` names the key or tensor and
    /// what was expected.
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    /// The probe (a load in a child process) died: llama.cpp aborted, or the child was killed.
    #[error("{path}: llama.cpp aborted while loading: {log}")]
    ProbeAborted { path: PathBuf, log: String },
    /// An invalid option value.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A setting outside its valid range (see `settings`).
    #[error("{setting} = {value} is out of range: expected {expected}")]
    OutOfRange {
        setting: &'static str,
        value: String,
        expected: String,
    },
    /// Settings that cannot work together; the message names them and a value that would work.
    #[error("{0}")]
    Conflict(String),
}

/// An expert matrix whose experts the GGUF does not hold one by one: neither stored as such nor
/// as the parts of a fused tensor.
#[derive(Debug, Clone, thiserror::Error)]
#[error("tensor {tensor}: its {n_expert} experts of {expert_bytes} bytes are not in the GGUF, neither stored as such nor as the parts of a fused tensor")]
pub struct ExpertsNotInFile {
    /// The tensor.
    pub tensor: String,
    /// Its experts.
    pub n_expert: i64,
    /// Bytes of one expert.
    pub expert_bytes: usize,
}

/// A routing node named an expert its layer does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("layer {layer} routed to expert {expert}, out of 0..{n_expert}")]
pub struct ExpertOutOfRange {
    /// The layer.
    pub layer: u32,
    /// The id it routed to.
    pub expert: i32,
    /// The layer's experts.
    pub n_expert: usize,
}

/// What the expert streamer failed at; the decode is stopped before any expert matmul runs on
/// unread data.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A routing node named an expert the layer does not have.
    #[error(transparent)]
    Routing(#[from] ExpertOutOfRange),
    /// Reading a layer's experts failed; nothing partially read counts as resident.
    #[error("reading experts of layer {layer}: {source}")]
    Read {
        /// The layer.
        layer: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Setting up (reserving memory, opening the file, starting threads) failed.
    #[error("{what}: {source}")]
    Setup {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An expert tensor the file does not hold in a form the streamer can read.
    #[error(transparent)]
    NotInFile(#[from] ExpertsNotInFile),
    /// A routing node's ids could not be read as host I32.
    #[error("routing node of layer {0} is not readable host I32")]
    UnreadableRouting(u32),
    /// The streamer's lock was poisoned by an earlier panic.
    #[error("the expert streamer panicked earlier")]
    Poisoned,
    /// A lossy knob changed a routing node's ids or dropped slots, but the node (or the layer's
    /// router weights) is not the host tensor they are written back into.
    #[error("the lossy knobs could not rewrite the routing of layer {0}: its routing node or router weights are not host tensors of the expected shape")]
    UnwritableRouting(u32),
    /// A lossy knob is on but the routing node of this layer does not select from the router's
    /// probabilities (`ffn_moe_probs`) in host memory.
    #[error("expert_substitute and drop_cold need the router's probabilities (ffn_moe_probs) at the routing node of layer {0}; this architecture's graph selects experts from something else")]
    NoRouterProbs(u32),
    /// The routing trace (`routing_trace`) could not be created or written.
    #[error("routing trace {}: {source}", path.display())]
    Trace {
        /// The trace's file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What the prefill device's arena or its loaders failed at; the wide graph is stopped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// A ggml call (allocation, binding, an upload view) failed.
    #[error(transparent)]
    Ffi(#[from] FfiError),
    /// A weight the arena copies from is not in host memory.
    #[error("{0}: not in host memory")]
    NotOnHost(String),
    /// The KV cache and recurrent state could not be moved into the device's host buffer type.
    #[error("moving the KV cache and recurrent state into {buft}: {why}")]
    MemoryMove {
        /// The buffer type they were to move into.
        buft: String,
        /// What failed.
        why: String,
    },
    /// A streamed expert matrix the file does not hold expert by expert.
    #[error(transparent)]
    NotInFile(#[from] ExpertsNotInFile),
    /// A weight's type has no ggml dequantizer, so it cannot be converted for the device.
    #[error("{tensor}: ggml cannot dequantize {ty}")]
    NoDequantizer {
        /// The weight.
        tensor: String,
        /// Its ggml type.
        ty: String,
    },
    /// Opening or reading the model file, or starting a loader thread.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A loader job that does not fit its target (an internal inconsistency).
    #[error("{0}")]
    Job(String),
    /// The graph reached a pacing point out of order, so a slot would be computed on unfilled.
    #[error("the device graph {0}: a pacing point was skipped")]
    PacingSkipped(String),
    /// A routing node named an expert the layer does not have.
    #[error(transparent)]
    Routing(#[from] ExpertOutOfRange),
    /// A routing node's ids could not be read as I32.
    #[error("routing node of layer {0} is not readable I32")]
    UnreadableRouting(u32),
    /// The arena's lock was poisoned by an earlier panic.
    #[error("the arena panicked earlier")]
    Poisoned,
}

impl DeviceError {
    /// An I/O failure while doing `what`.
    pub(crate) fn io(what: impl Into<String>, e: std::io::Error) -> Self {
        DeviceError::Io {
            what: what.into(),
            source: Arc::new(e),
        }
    }
}

/// Shorthand for engine results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
