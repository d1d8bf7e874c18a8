//! llama.cpp's sampler chains, built and run through the shim (a throw comes back as an error).
use std::ptr::NonNull;

use ggml_sys as sys;

use super::context::LlamaContext;
use super::guard::{ErrBuf, Thrown};
use super::vocab::Token;

/// An owned sampler chain.
pub struct Sampler(NonNull<sys::llama_sampler>);

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: we own the chain, which owns the samplers added to it.
        unsafe { sys::llama_sampler_free(self.0.as_ptr()) }
    }
}

impl Sampler {
    fn build(
        greedy: bool,
        seed: u32,
        temperature: f32,
        top_k: i32,
        top_p: f32,
    ) -> Result<Sampler, Thrown> {
        let mut out: *mut sys::llama_sampler = std::ptr::null_mut();
        let mut e = ErrBuf::new();
        // SAFETY: plain values in; the shim writes `out` (a chain we then own) and the message,
        // and frees a half-built chain itself when a step throws.
        let rc = unsafe {
            sys::shim::bmoe_sampler_chain_new(
                greedy,
                seed,
                temperature,
                top_k,
                top_p,
                &mut out,
                e.ptr(),
                e.len(),
            )
        };
        e.check("llama_sampler_chain_init", rc)?;
        NonNull::new(out).map(Sampler).ok_or_else(|| Thrown {
            call: "llama_sampler_chain_init",
            what: "returned NULL".into(),
        })
    }

    /// Argmax.
    pub fn greedy() -> Result<Sampler, Thrown> {
        Self::build(true, 0, 0.0, 0, 1.0)
    }

    /// top-k, top-p, temperature, then a seeded draw.
    pub fn seeded(seed: u32, temperature: f32, top_k: i32, top_p: f32) -> Result<Sampler, Thrown> {
        Self::build(false, seed, temperature, top_k, top_p)
    }

    /// Samples from output row `idx` of the last decode (-1 = the last row).
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> Result<Token, Thrown> {
        let mut tok: Token = 0;
        let mut e = ErrBuf::new();
        // SAFETY: the context is live and has logits from its last decode (the session only
        // samples right after a successful decode that requested output rows); the shim writes
        // `tok` and the message.
        let rc = unsafe {
            sys::shim::bmoe_sampler_sample(
                self.0.as_ptr(),
                ctx.raw(),
                idx,
                &mut tok,
                e.ptr(),
                e.len(),
            )
        };
        e.check("llama_sampler_sample", rc)?;
        Ok(tok)
    }
}
