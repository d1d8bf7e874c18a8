//! Loading a model: checks the file before llama.cpp sees it, picks the devices, reports why a load
//! failed in words.
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::ffi::model::{KvOverride, LlamaModel, RawLoadParams};
use crate::ffi::registry::Device;
use crate::options::{LoadOptions, SessionOptions};
use crate::session::Session;

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
}

/// A loaded model; sessions borrow it.
pub struct Model {
    pub(crate) raw: LlamaModel,
    pub(crate) info: ModelInfo,
    pub(crate) template: Option<String>,
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

impl Model {
    /// Loads a model as `opts` says.
    pub fn load(opts: &LoadOptions) -> Result<Model> {
        let path = &opts.path;
        let index = crate::gguf_index::GgufIndex::open(path)?;
        let file_bytes = index.total_file_bytes();
        let arch = index.arch().unwrap_or_default();
        let cpu = Device::cpu().ok_or_else(|| EngineError::ModelLoad {
            path: path.clone(),
            reason: "this build has no CPU backend".into(),
        })?;
        let mut kv_overrides = Vec::new();
        if let Some(k) = opts.n_expert_used {
            let n_expert = index.get_u64(&format!("{arch}.expert_count")).unwrap_or(0);
            if n_expert == 0 {
                return Err(EngineError::InvalidOption(format!(
                    "n_expert_used = {k} but {} is not a mixture-of-experts model",
                    path.display()
                )));
            }
            if k == 0 || u64::from(k) > n_expert {
                return Err(EngineError::InvalidOption(format!(
                    "n_expert_used = {k} is out of range: the model has {n_expert} experts"
                )));
            }
            kv_overrides.push(KvOverride::Int(
                format!("{arch}.expert_used_count"),
                i64::from(k),
            ));
        }
        let raw = LlamaModel::load(
            path,
            &RawLoadParams {
                devices: vec![cpu],
                mmap: true,
                kv_overrides,
            },
        )
        .map_err(|reason| EngineError::ModelLoad {
            path: path.clone(),
            reason,
        })?;
        let n_expert = raw
            .meta(&format!("{arch}.expert_count"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let n_expert_used = opts.n_expert_used.unwrap_or_else(|| {
            raw.meta(&format!("{arch}.expert_used_count"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        });
        let template = raw.chat_template();
        let info = ModelInfo {
            path: path.clone(),
            file_bytes,
            arch,
            desc: raw.desc(),
            n_layer: raw.n_layer(),
            n_embd: raw.n_embd(),
            n_vocab: raw.vocab().n_tokens() as u32,
            n_ctx_train: raw.n_ctx_train(),
            n_expert,
            n_expert_used,
            weight_bytes: raw.size(),
            has_chat_template: template.is_some(),
        };
        Ok(Model {
            raw,
            info,
            template,
        })
    }

    /// What was loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Opens a session (a llama.cpp context) on this model.
    pub fn session(&self, opts: &SessionOptions) -> Result<Session<'_>> {
        Session::new(self, opts)
    }

    /// Tokenizes `text` (BOS added where the model asks for it).
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<i32>> {
        self.raw
            .vocab()
            .tokenize(text, add_special, add_special)
            .map_err(EngineError::Tokenize)
    }

    /// The bytes a token sequence stands for.
    pub fn detokenize(&self, tokens: &[i32]) -> Vec<u8> {
        self.raw.vocab().detokenize(tokens, false)
    }

    /// The chat template, if the model carries one.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// Renders `user` as one user message with the model's template, reasoning off where the
    /// template has a thinking block; the text unchanged when the model has no usable template.
    pub fn render_user_message(&self, user: &str) -> String {
        let Some(t) = self.template.as_deref() else {
            return user.to_string();
        };
        match crate::ffi::model::apply_chat_template(t, user) {
            Some(mut s) => {
                // Reasoning off, as Qwen3's own template does with enable_thinking=false.
                if t.contains("<think>") && !s.trim_end().ends_with("</think>") {
                    s.push_str("<think>\n\n</think>\n\n");
                }
                s
            }
            None => user.to_string(),
        }
    }
}
