//! The engine's typed errors: each says what went wrong in words a user can act on.
use std::path::PathBuf;

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
    #[error("could not create a llama.cpp context: {reason}")]
    Context { reason: String },
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
    /// Two choices start with the same token, so their first-token scores cannot tell them apart.
    #[error("choices {first} ({first_text:?}) and {second} ({second_text:?}) start with the same token {token}: first-token scoring cannot tell them apart")]
    CollidingChoices {
        first: usize,
        first_text: String,
        second: usize,
        second_text: String,
        token: i32,
    },
    /// Tokenization failed.
    #[error("tokenization failed: {0}")]
    Tokenize(String),
    /// `llama_decode` returned an error.
    #[error("decode failed: {0}")]
    Decode(String),
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The model's architecture cannot use a requested mechanism.
    #[error("{0}")]
    Unsupported(String),
    /// Expert streaming failed (a read error, a short read); the decode was stopped.
    #[error("expert streaming: {0}")]
    Stream(String),
    /// The prefill device failed (arena binding, a skipped pacing point).
    #[error("prefill device: {0}")]
    Device(String),
    /// Reading from the model file failed.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A synthetic model specification is invalid.
    #[error("synthetic model: {0}")]
    Synth(String),
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
    /// A setting outside its valid range (see `limits`).
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

/// Shorthand for engine results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
