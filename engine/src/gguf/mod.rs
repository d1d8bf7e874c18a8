//! GGUF files as stored: the first check a path gets, where every tensor lives ([`index`]), and
//! what llama.cpp's loader would abort on ([`check`]).
use std::io::Read;
use std::path::Path;

use crate::error::{EngineError, Result};

/// `LLAMA_MAX_LAYERS` in llama-hparams.h: no model llama.cpp loads has more.
pub(crate) const MAX_LAYERS: i64 = 512;
/// `LLAMA_MAX_EXPERTS` in llama-hparams.h.
pub(crate) const MAX_EXPERTS: i64 = 1024;

pub mod check;
mod graph_check;
pub mod index;
mod walk;

/// Writing GGUF files (the synthetic models of `bmoe-synth`, test fixtures): the gguf builder and
/// ggml's quantizer, safe wrappers from the engine's private `ffi`.
pub mod write {
    pub use crate::ffi::backend_init;
    pub use crate::ffi::gguf::{GgmlType, GgufBuilder};
    pub use crate::ffi::quant::{block_size, quantize, requires_imatrix, row_size, type_name};
}

/// Checks that `path` exists, is readable and starts like a GGUF.
pub fn check_gguf_file(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => EngineError::ModelMissing {
            path: path.to_path_buf(),
        },
        _ => EngineError::ModelUnreadable {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    if meta.is_dir() {
        return Err(EngineError::ModelUnreadable {
            path: path.to_path_buf(),
            source: std::io::Error::other("it is a directory"),
        });
    }
    let mut f = std::fs::File::open(path).map_err(|e| EngineError::ModelUnreadable {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut magic = [0u8; 4];
    let n = f
        .read(&mut magic)
        .map_err(|e| EngineError::ModelUnreadable {
            path: path.to_path_buf(),
            source: e,
        })?;
    if n < 4 || &magic != b"GGUF" {
        return Err(EngineError::NotGguf {
            path: path.to_path_buf(),
            magic: String::from_utf8_lossy(&magic[..n]).into_owned(),
        });
    }
    Ok(meta.len())
}
