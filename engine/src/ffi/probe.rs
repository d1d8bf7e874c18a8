//! Asking a device, with a probe op rather than a list, whether its matmul takes a weight.
use ggml_sys as sys;

use super::registry::Device;
use super::tensor::{TensorPtr, ViewScratch};

/// Whether `dev` computes a `MUL_MAT` (or, for an expert matrix, a `MUL_MAT_ID`) of `w` against
/// F32 activations. The probe ops live in a throwaway header-only context; `w` is only read.
pub fn device_takes_matmul(dev: Device, w: TensorPtr, experts: bool) -> bool {
    device_takes_matmul_of(dev, w.layout().ty(), w.ne(), experts)
}

/// As `device_takes_matmul`, for a matrix of shape `ne` in type `ty`.
pub fn device_takes_matmul_of(
    dev: Device,
    ty: sys::ggml_type,
    ne: [i64; 4],
    experts: bool,
) -> bool {
    let Ok(mut scratch) = ViewScratch::new() else {
        return false;
    };
    let ctx = scratch.ctx();
    let n_tokens = 32;
    // SAFETY: header-only tensors in our own context (no data, room for the four made here);
    // supports_op only inspects types and shapes. The context outlives the op (dropped after).
    unsafe {
        let w = if experts {
            sys::ggml_new_tensor_3d(ctx, ty, ne[0], ne[1], ne[2])
        } else {
            sys::ggml_new_tensor_2d(ctx, ty, ne[0], ne[1])
        };
        let op = if experts {
            let n_used = 2.min(ne[2]).max(1);
            let b = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, ne[0], n_used, n_tokens);
            let ids = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_I32, n_used, n_tokens);
            sys::ggml_mul_mat_id(ctx, w, b, ids)
        } else {
            let b = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, ne[0], n_tokens);
            sys::ggml_mul_mat(ctx, w, b)
        };
        !op.is_null() && sys::ggml_backend_dev_supports_op(dev.raw(), op)
    }
}

/// ggml's name of `w`'s type.
pub fn type_name(w: TensorPtr) -> String {
    super::quant::type_name(w.layout().ty())
}

/// Whether `dev` supports the live graph node `t`'s op for its types and shapes.
pub fn supports_node(dev: Device, t: &sys::ggml_tensor) -> bool {
    // SAFETY: `t` is a live node of the graph being computed; supports_op only inspects its op,
    // types and shapes.
    unsafe { sys::ggml_backend_dev_supports_op(dev.raw(), t) }
}

/// The inputs of the live graph node `t` that live in a buffer `dev` cannot read: (name, whether
/// it is a model weight).
pub fn unreadable_inputs(dev: Device, t: &sys::ggml_tensor) -> Vec<(String, bool)> {
    (0..sys::GGML_MAX_SRC)
        .filter_map(|i| super::tensor::src(t, i))
        .filter_map(|s| {
            let root = super::tensor::view_root(s);
            if root.buffer.is_null() {
                return None;
            }
            // SAFETY: a non-null buffer of a live tensor is a live buffer; supports_buft only
            // compares buffer types.
            let readable = unsafe {
                sys::ggml_backend_dev_supports_buft(
                    dev.raw(),
                    sys::ggml_backend_buffer_get_type(root.buffer),
                )
            };
            (!readable).then(|| {
                (
                    super::tensor::name(s).to_string(),
                    super::tensor::is_weight(root),
                )
            })
        })
        .collect()
}
