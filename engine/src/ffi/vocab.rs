//! Tokenize and detokenize through a model's vocabulary.
use std::marker::PhantomData;

use ggml_sys as sys;

use super::error::FfiError;
use super::guard::{ErrBuf, Thrown};

/// A token id.
pub type Token = sys::llama_token;

/// A model's vocabulary, borrowed from the model.
#[derive(Clone, Copy)]
pub struct Vocab<'m> {
    raw: *const sys::llama_vocab,
    _model: PhantomData<&'m ()>,
}

impl<'m> Vocab<'m> {
    pub(super) fn new(raw: *const sys::llama_vocab) -> Self {
        Self {
            raw,
            _model: PhantomData,
        }
    }

    /// Tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        // SAFETY: read-only query on a vocab that lives as long as 'm.
        unsafe { sys::llama_vocab_n_tokens(self.raw) as usize }
    }

    /// The beginning-of-sequence token, else the end-of-sequence one (lm-evaluation-harness's
    /// `prefix_token_id`); `None` when the vocabulary has neither.
    pub fn prefix_token(&self) -> Option<Token> {
        // SAFETY: read-only queries on a vocab that lives as long as 'm.
        let (bos, eos) = unsafe {
            (
                sys::llama_vocab_bos(self.raw),
                sys::llama_vocab_eos(self.raw),
            )
        };
        [bos, eos].into_iter().find(|&t| t >= 0)
    }

    /// True for end-of-generation tokens.
    pub fn is_eog(&self, t: Token) -> bool {
        // SAFETY: read-only query.
        unsafe { sys::llama_vocab_is_eog(self.raw, t) }
    }

    /// Tokenizes `text`. `add_special` adds BOS where the model asks for it; `parse_special`
    /// turns control-token text into control tokens.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>, FfiError> {
        let len = i32::try_from(text.len())
            .map_err(|_| FfiError::Argument("text longer than 2 GiB".into()))?;
        let mut out = vec![0 as Token; text.len() + 8];
        loop {
            let cap = i32::try_from(out.len())
                .map_err(|_| FfiError::Argument("text longer than 2 GiB".into()))?;
            let mut n = 0i32;
            let mut e = ErrBuf::new();
            // SAFETY: `text` is valid for `len` bytes (no NUL needed), `out` for `cap` tokens; the
            // shim writes `n` and the message.
            let rc = unsafe {
                sys::shim::bmoe_tokenize(
                    self.raw,
                    text.as_ptr().cast(),
                    len,
                    out.as_mut_ptr(),
                    cap,
                    add_special,
                    parse_special,
                    &mut n,
                    e.ptr(),
                    e.len(),
                )
            };
            e.check("llama_tokenize", rc)?;
            if n == i32::MIN {
                return Err(FfiError::Argument("tokenization overflowed".into()));
            }
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            out.resize(n.unsigned_abs() as usize, 0);
        }
    }

    /// The bytes one token stands for (special tokens rendered when `special`).
    pub fn piece(&self, t: Token, special: bool) -> Result<Vec<u8>, Thrown> {
        let mut buf = vec![0u8; 64];
        loop {
            let cap = i32::try_from(buf.len()).unwrap_or(i32::MAX);
            let mut n = 0i32;
            let mut e = ErrBuf::new();
            // SAFETY: buffer valid for `cap` bytes; llama writes at most that many; the shim
            // writes `n` and the message.
            let rc = unsafe {
                sys::shim::bmoe_token_to_piece(
                    self.raw,
                    t,
                    buf.as_mut_ptr().cast(),
                    cap,
                    0,
                    special,
                    &mut n,
                    e.ptr(),
                    e.len(),
                )
            };
            e.check("llama_token_to_piece", rc)?;
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            buf.resize(n.unsigned_abs() as usize, 0);
        }
    }

    /// The bytes a token sequence stands for.
    pub fn detokenize(&self, tokens: &[Token], special: bool) -> Result<Vec<u8>, Thrown> {
        let mut out = Vec::new();
        for &t in tokens {
            out.extend(self.piece(t, special)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::ffi::model::{LlamaModel, RawLoadParams};
    use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};

    /// Below the engine's checks (which refuse this file): the file straight into llama.cpp
    /// loads, and tokenizing "hi" throws std::out_of_range from the byte fallback. Through the
    /// shim that is an error; without it the process aborts ("Rust cannot catch foreign
    /// exceptions").
    #[test]
    fn a_llama_cpp_exception_is_an_error_not_an_abort() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("tiny.gguf");
        let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe);
        write_model(&spec, &p).expect("write the tiny model");
        let mut b = std::fs::read(&p).expect("read it back");
        let at = b
            .windows(6)
            .position(|w| w == b"<0x68>")
            .expect("the byte token for 'h'");
        b[at..at + 6].copy_from_slice(b"<0x6G>");
        std::fs::write(&p, b).expect("write the damaged copy");
        let m = LlamaModel::load(&p, &RawLoadParams::cpu_only()).expect("llama.cpp loads the file");
        let e = m.vocab().tokenize("hi", false, false).unwrap_err();
        assert!(
            e.to_string().contains("llama.cpp failed in llama_tokenize"),
            "{e}"
        );
    }
}
