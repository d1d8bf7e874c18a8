//! The proof the engine holds before it moves a weight: no graph computes on the model now.
//!
//! A weight tensor's `buffer`, `data`, `extra`, type and strides are read by the backends while a
//! graph computes. Every call that computes (`LlamaContext::decode`) takes the model's execution
//! guard mutably, and every call that writes those fields takes a [`Quiet`] borrowed mutably from
//! the same guard, so the borrow checker keeps the two apart.
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

/// One compute at a time per model: the lock every decode and every weight move of a model holds.
#[derive(Debug, Default)]
pub struct ExecLock(Mutex<()>);

/// The held execution lock of one model.
pub struct ExecGuard<'a> {
    lock: &'a ExecLock,
    _held: MutexGuard<'a, ()>,
}

/// Proof that no graph computes on the model whose guard it was borrowed from, for as long as it
/// lives. Not `Send`: it stays with the thread holding the guard.
pub struct Quiet<'g> {
    _borrow: PhantomData<&'g mut ()>,
    _not_send: PhantomData<*const ()>,
}

impl ExecLock {
    /// Waits for the lock. A panic while it was held leaves nothing half-moved that the next
    /// holder relies on (weights are put back before a call returns), so poisoning is ignored.
    pub fn lock(&self) -> ExecGuard<'_> {
        ExecGuard {
            lock: self,
            _held: self.0.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

impl ExecGuard<'_> {
    /// The proof, for moves made before or after a compute (not during: `decode` needs the guard).
    pub fn quiet(&mut self) -> Quiet<'_> {
        Quiet {
            _borrow: PhantomData,
            _not_send: PhantomData,
        }
    }

    /// True when this guard holds `lock`.
    pub(super) fn holds(&self, lock: &ExecLock) -> bool {
        std::ptr::eq(self.lock, lock)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use crate::ffi::batch::Batch;
    use crate::ffi::context::{ContextParams, LlamaContext};
    use crate::ffi::model::{LlamaModel, RawLoadParams};
    use crate::ffi::region::Region;
    use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};

    fn tiny(dir: &std::path::Path, name: &str) -> LlamaModel {
        let p = dir.join(name);
        let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe);
        write_model(&spec, &p).expect("write the tiny model");
        LlamaModel::load(&p, &RawLoadParams::cpu_only()).expect("load")
    }

    fn context(m: &LlamaModel) -> LlamaContext<'_> {
        LlamaContext::new(
            m,
            ContextParams {
                n_ctx: 64,
                n_batch: 1,
                n_ubatch: 1,
                n_outputs_max: 1,
                threads: 1,
                hook: None,
                abort: Arc::new(AtomicBool::new(false)),
                persistent_threads: false,
                cpus: Vec::new(),
                n_seq_max: 1,
            },
        )
        .expect("context")
    }

    /// A decode runs only under its own model's lock: another model's guard lends no proof about
    /// this model's weights.
    #[test]
    fn decode_refuses_another_models_guard() {
        let d = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tiny(d.path(), "a.gguf"), tiny(d.path(), "b.gguf"));
        let mut ctx = context(&a);
        let mut batch = Batch::new(1);
        batch.push(0, 0, true);
        let e = ctx
            .decode(&batch, &mut b.exec().lock())
            .expect_err("decode under model b's lock");
        assert!(e.to_string().contains("execution lock"), "{e}");
        ctx.decode(&batch, &mut a.exec().lock())
            .expect("decode under its own lock");
        assert_eq!(ctx.logits(-1).map(<[f32]>::len), Some(a.vocab().n_tokens()));
    }

    /// A move onto memory that cannot hold the weight, or back onto a binding that held fewer
    /// bytes, is refused before the tensor changes.
    #[test]
    fn a_move_that_does_not_fit_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let (m, created) = {
            let p = d.path().join("t.gguf");
            let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe);
            write_model(&spec, &p).expect("write the tiny model");
            let idx = crate::gguf::index::GgufIndex::open(&p).expect("index");
            LlamaModel::load_unfilled(idx.header(), &RawLoadParams::cpu_only())
                .expect("load unfilled")
        };
        let mut exec = m.exec().lock();
        let mut q = exec.quiet();
        let big = created
            .iter()
            .copied()
            .max_by_key(|t| t.nbytes())
            .expect("a tensor");
        let small = created
            .iter()
            .copied()
            .min_by_key(|t| t.nbytes())
            .expect("a tensor");
        assert!(big.nbytes() > small.nbytes() && big.nbytes() > 4096);
        let before = big.binding();
        let short = Region::reserve(big.nbytes() / 2).expect("region");
        let e = big
            .rebind(&short.as_slice()[..big.nbytes() / 2], &mut q)
            .expect_err("a half-size binding");
        assert!(e.to_string().contains("bytes to a tensor of"), "{e}");
        assert_eq!(big.binding(), before, "a refused move changes nothing");
        let e = big
            .restore(small.binding(), &mut q)
            .expect_err("a smaller tensor's binding");
        assert!(e.to_string().contains("restoring a binding"), "{e}");
        assert_eq!(big.binding(), before);
        let e = big
            .upload(&[0u8; 4])
            .expect_err("an upload of the wrong size");
        assert!(e.to_string().contains("uploading 4 bytes"), "{e}");
        let cpu = crate::ffi::registry::Device::cpu().expect("cpu device");
        let slot = crate::ffi::buffer::WeightsBuffer::alloc(
            crate::ffi::buffer::BufferType::of_device(cpu),
            64,
        )
        .expect("a 64-byte buffer");
        let e = slot.bind(big, 0, &mut q).expect_err("a slot without room");
        assert!(e.to_string().contains("do not fit a buffer of"), "{e}");
        assert_eq!(big.binding(), before);
        let whole = Region::reserve(big.nbytes()).expect("region");
        big.rebind(whole.as_slice(), &mut q)
            .expect("a binding that fits");
        big.restore(before, &mut q).expect("back where it was");
        assert_eq!(big.binding(), before);
    }
}
