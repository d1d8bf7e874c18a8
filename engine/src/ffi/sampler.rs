//! llama.cpp's sampler chains.
use std::ptr::NonNull;

use ggml_sys as sys;

use super::context::LlamaContext;
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
    fn chain() -> *mut sys::llama_sampler {
        // SAFETY: default params are plain data.
        unsafe { sys::llama_sampler_chain_init(sys::llama_sampler_chain_default_params()) }
    }

    /// Argmax.
    pub fn greedy() -> Sampler {
        let c = Self::chain();
        // SAFETY: `c` is a fresh chain; the chain takes ownership of the added sampler.
        unsafe { sys::llama_sampler_chain_add(c, sys::llama_sampler_init_greedy()) };
        Sampler(NonNull::new(c).expect("llama_sampler_chain_init returned NULL"))
    }

    /// top-k, top-p, temperature, then a seeded draw.
    pub fn seeded(seed: u32, temperature: f32, top_k: i32, top_p: f32) -> Sampler {
        let c = Self::chain();
        // SAFETY: `c` is a fresh chain; the chain takes ownership of each added sampler.
        unsafe {
            if top_k > 0 {
                sys::llama_sampler_chain_add(c, sys::llama_sampler_init_top_k(top_k));
            }
            if top_p < 1.0 {
                sys::llama_sampler_chain_add(c, sys::llama_sampler_init_top_p(top_p, 1));
            }
            sys::llama_sampler_chain_add(c, sys::llama_sampler_init_temp(temperature));
            sys::llama_sampler_chain_add(c, sys::llama_sampler_init_dist(seed));
        }
        Sampler(NonNull::new(c).expect("llama_sampler_chain_init returned NULL"))
    }

    /// Samples from output row `idx` of the last decode (-1 = the last row).
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> Token {
        // SAFETY: the context is live and has logits from its last decode (the session only
        // samples right after a successful decode that requested output rows).
        unsafe { sys::llama_sampler_sample(self.0.as_ptr(), ctx.raw(), idx) }
    }
}
