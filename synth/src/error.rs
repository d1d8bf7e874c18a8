//! What writing a synthetic model fails with.
use std::path::PathBuf;

/// A synthetic model could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The specification is invalid (a dimension a type's block does not divide, ...).
    #[error("synthetic model: {0}")]
    Invalid(String),
    /// Writing a file of the model failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file being written.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The synth crate's result.
pub type Result<T> = std::result::Result<T, SynthError>;
