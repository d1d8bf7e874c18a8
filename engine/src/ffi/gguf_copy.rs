//! Copying a read header's key-values into a header being built, as llama.cpp reads them.
//!
//! ggml's reader keeps a key as the bytes the file holds (a key may hold a NUL byte), but every
//! lookup (`gguf_find_key`) compares C strings and takes the first match, and its writer aborts the
//! process on a key that is empty as a C string (`GGML_ASSERT(!key.empty())`, gguf.cpp:145-169)
//! and on a second `general.alignment` that is not a power-of-two u32. `gguf_set_kv` hands every
//! key over as a C string, in order, later ones replacing earlier ones: a file whose key starts
//! with a NUL byte, which llama.cpp's own load takes, aborted the streamed load (issue 55). This
//! copy gives the built header exactly the values llama.cpp's lookups find in the file: each key
//! as a C string, the first of equal ones, none that is empty (no lookup can find it).
use std::collections::HashSet;
use std::ffi::{c_char, CStr, CString};

use super::gguf::{GgufBuilder, GgufFile, GgufMeta};
use ggml_sys as sys;

/// What a header copy left out, for the load's log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Keys copied.
    pub copied: usize,
    /// Keys empty as C strings (their first byte is NUL): no lookup finds them.
    pub unnamed: usize,
    /// Keys equal to an earlier one as C strings (they differ after a NUL byte): lookups find the
    /// earlier one.
    pub shadowed: Vec<String>,
}

impl GgufBuilder {
    /// Copies every key-value of `src` that llama.cpp's lookups can find (its tensor infos are
    /// not copied); see the module comment.
    pub fn copy_kv(&mut self, src: &GgufFile) -> CopyReport {
        let c = src.raw();
        let mut seen = HashSet::new();
        let mut report = CopyReport::default();
        // SAFETY: a read-only query on a live context.
        let n = unsafe { sys::gguf_get_n_kv(c) };
        for id in 0..n {
            // SAFETY: `id` is below the count; the key is a NUL-terminated string the context
            // owns, copied here.
            let key = unsafe { CStr::from_ptr(sys::gguf_get_key(c, id)) }.to_owned();
            if key.is_empty() {
                report.unnamed += 1;
                continue;
            }
            if !seen.insert(key.clone()) {
                report.shadowed.push(key.to_string_lossy().into_owned());
                continue;
            }
            self.copy_one(c, id, &key);
            report.copied += 1;
        }
        report
    }

    fn copy_one(&mut self, c: *mut sys::gguf_context, id: i64, key: &CString) {
        let dst = self.raw();
        let k = key.as_ptr();
        // SAFETY: `id` is a key of the live context `c`; each getter is called for the type the
        // context reports for it, as ggml asserts; the values are copied by the setters, the
        // string pointers are owned by `c` and live until this returns.
        unsafe {
            match sys::gguf_get_kv_type(c, id) {
                sys::GGUF_TYPE_ARRAY => copy_array(dst, c, id, k),
                sys::GGUF_TYPE_STRING => {
                    sys::gguf_set_val_str(dst, k, sys::gguf_get_val_str(c, id))
                }
                sys::GGUF_TYPE_UINT8 => sys::gguf_set_val_u8(dst, k, sys::gguf_get_val_u8(c, id)),
                sys::GGUF_TYPE_INT8 => sys::gguf_set_val_i8(dst, k, sys::gguf_get_val_i8(c, id)),
                sys::GGUF_TYPE_UINT16 => {
                    sys::gguf_set_val_u16(dst, k, sys::gguf_get_val_u16(c, id))
                }
                sys::GGUF_TYPE_INT16 => sys::gguf_set_val_i16(dst, k, sys::gguf_get_val_i16(c, id)),
                sys::GGUF_TYPE_UINT32 => {
                    sys::gguf_set_val_u32(dst, k, sys::gguf_get_val_u32(c, id))
                }
                sys::GGUF_TYPE_INT32 => sys::gguf_set_val_i32(dst, k, sys::gguf_get_val_i32(c, id)),
                sys::GGUF_TYPE_FLOAT32 => {
                    sys::gguf_set_val_f32(dst, k, sys::gguf_get_val_f32(c, id))
                }
                sys::GGUF_TYPE_UINT64 => {
                    sys::gguf_set_val_u64(dst, k, sys::gguf_get_val_u64(c, id))
                }
                sys::GGUF_TYPE_INT64 => sys::gguf_set_val_i64(dst, k, sys::gguf_get_val_i64(c, id)),
                sys::GGUF_TYPE_FLOAT64 => {
                    sys::gguf_set_val_f64(dst, k, sys::gguf_get_val_f64(c, id))
                }
                sys::GGUF_TYPE_BOOL => {
                    sys::gguf_set_val_bool(dst, k, sys::gguf_get_val_bool(c, id))
                }
                // ggml's reader refuses any other type, so a read header holds none.
                _ => {}
            }
        }
    }
}

/// Copies the array `id` of `c` into `dst` under `k`.
///
/// # Safety
/// `c` and `dst` are live contexts, `id` is an array key of `c`, `k` a NUL-terminated key.
unsafe fn copy_array(
    dst: *mut sys::gguf_context,
    c: *mut sys::gguf_context,
    id: i64,
    k: *const c_char,
) {
    // SAFETY: as the caller promises; the element getters are called for the element type the
    // context reports (gguf_get_arr_str for strings, gguf_get_arr_data otherwise, as ggml
    // asserts), with indices below its length; the setters copy the data.
    unsafe {
        let ty = sys::gguf_get_arr_type(c, id);
        let n = sys::gguf_get_arr_n(c, id);
        if ty == sys::GGUF_TYPE_STRING {
            let items: Vec<*const c_char> =
                (0..n).map(|i| sys::gguf_get_arr_str(c, id, i)).collect();
            sys::gguf_set_arr_str(dst, k, items.as_ptr().cast_mut(), n);
        } else {
            sys::gguf_set_arr_data(dst, k, ty, sys::gguf_get_arr_data(c, id), n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF header (version 3, no tensors) holding `kvs` as (key bytes, u32 value).
    fn header(kvs: &[(&[u8], u32)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, v) in kvs {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(*k);
            b.extend(sys::GGUF_TYPE_UINT32.to_le_bytes());
            b.extend(v.to_le_bytes());
        }
        b
    }

    #[test]
    fn keys_are_copied_as_llama_cpp_looks_them_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.gguf");
        let kvs: &[(&[u8], u32)] = &[(b"\0a", 7), (b"k", 1), (b"k\0x", 2), (b"j\xff", 3)];
        std::fs::write(&path, header(kvs)).unwrap();
        let src = GgufFile::open(&path).unwrap();
        let mut b = GgufBuilder::new(0);
        let report = b.copy_kv(&src);
        assert_eq!(report.unnamed, 1);
        assert_eq!(report.shadowed, vec!["k".to_string()]);
        assert_eq!(report.copied, 2);
        let out = dir.path().join("out.gguf");
        std::fs::write(&out, b.meta_bytes()).unwrap();
        let built = GgufFile::open(&out).unwrap();
        // The first of the equal keys, as `gguf_find_key` finds it in the file.
        assert_eq!(built.get_u64("k"), src.get_u64("k"));
        assert_eq!(built.get_u64("k"), Some(1));
        assert_eq!(built.keys().len(), 2);
    }
}
