//! ggml's type traits and quantizer, for writing synthetic weights.
use ggml_sys as sys;

use super::gguf::GgmlType;

/// Elements per block of `ty`.
pub fn block_size(ty: GgmlType) -> usize {
    // SAFETY: pure lookup in ggml's type-traits table.
    unsafe { sys::ggml_blck_size(ty) as usize }
}

/// Bytes of one row of `n` elements of `ty`.
pub fn row_size(ty: GgmlType, n: usize) -> usize {
    // SAFETY: pure lookup in ggml's type-traits table.
    unsafe { sys::ggml_row_size(ty, n as i64) }
}

/// ggml's name for `ty` (`q4_0`).
pub fn type_name(ty: GgmlType) -> String {
    // SAFETY: returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(sys::ggml_type_name(ty)) }
        .to_string_lossy()
        .into_owned()
}

/// Converts `rows` rows of `n_per_row` f32s into `ty` with ggml's own quantizer; returns the bytes.
pub fn quantize(ty: GgmlType, src: &[f32], n_per_row: usize) -> Vec<u8> {
    assert!(
        n_per_row > 0 && src.len().is_multiple_of(n_per_row),
        "src is not whole rows"
    );
    assert!(
        n_per_row.is_multiple_of(block_size(ty)),
        "row width not a multiple of the block size"
    );
    let rows = src.len() / n_per_row;
    let mut dst = vec![0u8; rows * row_size(ty, n_per_row)];
    // SAFETY: `src` holds rows*n_per_row floats, `dst` exactly rows row_size bytes; no imatrix is
    // needed for the types the engine writes (checked by the synth spec validation).
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty,
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    debug_assert_eq!(written, dst.len());
    dst
}

/// True when ggml's quantizer needs an importance matrix for `ty`.
pub fn requires_imatrix(ty: GgmlType) -> bool {
    // SAFETY: pure lookup.
    unsafe { sys::ggml_quantize_requires_imatrix(ty) }
}

/// `n` elements of `ty` in `bytes` as f32s (ggml's own dequantizer); `None` when ggml has none for
/// `ty` or `bytes` is short.
pub fn to_f32(ty: GgmlType, bytes: &[u8], n: usize) -> Option<Vec<f32>> {
    if bytes.len() < row_size(ty, n) {
        return None;
    }
    if ty == sys::GGML_TYPE_F32 {
        return Some(
            bytes[..n * 4]
                .chunks_exact(4)
                .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        );
    }
    // SAFETY: ggml's type-traits table has an entry for every type; the pointer is static.
    let to_float = unsafe { (*sys::ggml_get_type_traits(ty)).to_float }?;
    let mut out = vec![0f32; n];
    // SAFETY: `bytes` holds the row_size of n elements of `ty` (checked), `out` n floats.
    unsafe { to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
    Some(out)
}

/// Whether ggml can convert `ty` to f32 (`to_f32` answers for it).
pub fn has_f32(ty: GgmlType) -> bool {
    // SAFETY: pure lookup in ggml's static type-traits table.
    ty == sys::GGML_TYPE_F32 || unsafe { (*sys::ggml_get_type_traits(ty)).to_float }.is_some()
}

/// Whether `ty` is a quantized (block) type.
pub fn is_quantized(ty: GgmlType) -> bool {
    // SAFETY: pure lookup in ggml's static type-traits table.
    unsafe { (*sys::ggml_get_type_traits(ty)).is_quantized }
}

/// Whether `ty` is NVFP4, whose matmul path in llama.cpp's graph asserts when a weight has both an
/// optional scale and an optional bias tensor.
pub fn is_nvfp4(ty: GgmlType) -> bool {
    ty == sys::GGML_TYPE_NVFP4
}
