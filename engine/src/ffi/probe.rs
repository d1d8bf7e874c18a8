//! Asking a device, with a probe op rather than a list, whether its matmul takes a weight.
use ggml_sys as sys;

use super::registry::Device;
use super::tensor::TensorPtr;

/// Whether `dev` computes a `MUL_MAT` (or, for an expert matrix, a `MUL_MAT_ID`) of `w` against
/// F32 activations. The probe ops live in a throwaway header-only context; `w` is only read.
pub fn device_takes_matmul(dev: Device, w: TensorPtr, experts: bool) -> bool {
    // SAFETY: plain size query.
    let overhead = unsafe { sys::ggml_tensor_overhead() };
    let params = sys::ggml_init_params {
        mem_size: 8 * overhead,
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    // SAFETY: ggml_init allocates its own arena; NULL means failure.
    let ctx = unsafe { sys::ggml_init(params) };
    if ctx.is_null() {
        return false;
    }
    let ne = w.ne();
    let n_tokens = 32;
    // SAFETY: header-only tensors in our context; the op nodes name `w` as a source without
    // touching its data; supports_op only inspects types and shapes. The context is freed last.
    unsafe {
        let op = if experts {
            let n_used = 2.min(ne[2]).max(1);
            let b = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, ne[0], n_used, n_tokens);
            let ids = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_I32, n_used, n_tokens);
            sys::ggml_mul_mat_id(ctx, w.raw(), b, ids)
        } else {
            let b = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, ne[0], n_tokens);
            sys::ggml_mul_mat(ctx, w.raw(), b)
        };
        let ok = !op.is_null() && sys::ggml_backend_dev_supports_op(dev.raw(), op);
        sys::ggml_free(ctx);
        ok
    }
}

/// ggml's name of `w`'s type.
pub fn type_name(w: TensorPtr) -> String {
    // SAFETY: ggml returns a static NUL-terminated name for every type.
    unsafe { std::ffi::CStr::from_ptr(sys::ggml_type_name((*w.raw()).type_)) }
        .to_string_lossy()
        .into_owned()
}
