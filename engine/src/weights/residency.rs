//! Every move of a weight tensor, named for what it is for. The memory a weight is moved onto is
//! checked to hold it; that memory's owner lives in `Model` and is dropped before the raw model
//! (see `Model`'s `Drop`), so no weight outlives what it points at while it can be computed on.
use crate::ffi::buffer::{BufferType, WeightsBuffer};
use crate::ffi::error::FfiError;
use crate::ffi::quiet::Quiet;
use crate::ffi::region::Region;
use crate::ffi::tensor::{Binding, Layout, TensorPtr};

/// Binds `t` to the start of `region`, engine memory the streamer fills (experts) or a
/// neutral value (zeros for an absent bias, ones for an absent scale).
pub fn onto_region(t: TensorPtr, region: &Region, q: &mut Quiet<'_>) -> Result<(), FfiError> {
    t.rebind(region.as_slice(), q)
}

/// Binds `t` to `bytes`, its own bytes in a read-only mapping of the GGUF (a lean load's
/// dense weights). Weights are never written through the binding.
pub fn onto_file(t: TensorPtr, bytes: &[u8], q: &mut Quiet<'_>) -> Result<(), FfiError> {
    if bytes.len() != t.nbytes() {
        return Err(FfiError::Argument(format!(
            "{}: {} bytes of file for a tensor of {}",
            t.name(),
            bytes.len(),
            t.nbytes()
        )));
    }
    t.rebind(bytes, q)
}

/// Copies `t`'s bytes into `region` and binds `t` there (`dense_weights = anon`: the weights
/// leave the file mapping for anonymous memory).
pub fn copied_into(t: TensorPtr, region: &mut Region, q: &mut Quiet<'_>) -> Result<(), FfiError> {
    let n = t.nbytes();
    let src = t
        .bytes(q)
        .ok_or_else(|| FfiError::Argument(format!("{}: not in host memory", t.name())))?;
    region
        .as_mut_slice()
        .get_mut(..n)
        .ok_or_else(|| {
            FfiError::Argument(format!("{}: a region too small to copy into", t.name()))
        })?
        .copy_from_slice(src);
    t.rebind(region.as_slice(), q)
}

/// Binds `t` at `off` in `buffer` (a slot of the prefill arena), first re-typed to `layout`
/// when the device computes it in another type.
pub fn onto_device(
    t: TensorPtr,
    buffer: &WeightsBuffer,
    off: usize,
    layout: Option<Layout>,
    q: &mut Quiet<'_>,
) -> Result<(), FfiError> {
    let before = t.layout();
    if let Some(l) = layout {
        t.set_layout(l, q);
    }
    let r = buffer.bind(t, off, q);
    if r.is_err() {
        // Not bound: the tensor keeps the layout its host binding holds.
        t.set_layout(before, q);
    }
    r
}

/// Puts `t` back on `host`, the binding read at load, in `layout`, the layout it had there.
pub fn back_to_host(
    t: TensorPtr,
    host: Binding,
    layout: Option<Layout>,
    q: &mut Quiet<'_>,
) -> Result<(), FfiError> {
    if let Some(l) = layout {
        t.set_layout(l, q);
    }
    t.restore(host, q)
}

/// Bytes `t` takes in `buft` when carried there in `layout` (its own layout when `None`).
pub fn device_bytes(
    t: TensorPtr,
    buft: BufferType,
    layout: Option<Layout>,
) -> Result<usize, FfiError> {
    match layout {
        Some(l) => buft.alloc_size_as(t, l),
        None => Ok(buft.alloc_size(t)),
    }
}
