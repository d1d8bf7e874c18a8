//! The gguf C API: write a GGUF's metadata and tensor table, read a GGUF's tensor table.
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use super::error::FfiError;
use ggml_sys as sys;

/// A tensor element type (ggml's enum).
pub type GgmlType = sys::ggml_type;

/// Builds a GGUF header (key-values and tensor infos); tensor data is written by the caller at the
/// offsets this reports, so a multi-GB file never has to sit in memory.
pub struct GgufBuilder {
    gguf: NonNull<sys::gguf_context>,
    // Holds the tensor descriptors (no data) that the gguf context copies infos from.
    meta: NonNull<sys::ggml_context>,
}

impl Drop for GgufBuilder {
    fn drop(&mut self) {
        // SAFETY: both contexts are owned here and freed once.
        unsafe {
            sys::gguf_free(self.gguf.as_ptr());
            sys::ggml_free(self.meta.as_ptr());
        }
    }
}

fn cs(s: &str) -> CString {
    CString::new(s).expect("GGUF keys and names are generated without NUL bytes")
}

impl GgufBuilder {
    /// An empty header with room for `max_tensors` tensor descriptors.
    pub fn new(max_tensors: usize) -> Self {
        super::backend_init();
        // SAFETY: plain constructors; `no_alloc` makes the ggml context hold descriptors only.
        unsafe {
            let gguf = sys::gguf_init_empty();
            let meta = sys::ggml_init(sys::ggml_init_params {
                mem_size: (max_tensors + 1) * sys::ggml_tensor_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            Self {
                gguf: NonNull::new(gguf).expect("gguf_init_empty returned NULL"),
                meta: NonNull::new(meta).expect("ggml_init returned NULL"),
            }
        }
    }

    /// Sets a string value.
    pub fn set_str(&mut self, key: &str, v: &str) {
        let (k, v) = (cs(key), cs(v));
        // SAFETY: live context; both strings NUL-terminated; gguf copies them.
        unsafe { sys::gguf_set_val_str(self.gguf.as_ptr(), k.as_ptr(), v.as_ptr()) }
    }

    /// Sets a u32 value.
    pub fn set_u32(&mut self, key: &str, v: u32) {
        let k = cs(key);
        // SAFETY: live context; key NUL-terminated.
        unsafe { sys::gguf_set_val_u32(self.gguf.as_ptr(), k.as_ptr(), v) }
    }

    /// Sets an f32 value.
    pub fn set_f32(&mut self, key: &str, v: f32) {
        let k = cs(key);
        // SAFETY: live context; key NUL-terminated.
        unsafe { sys::gguf_set_val_f32(self.gguf.as_ptr(), k.as_ptr(), v) }
    }

    /// Sets a bool value.
    pub fn set_bool(&mut self, key: &str, v: bool) {
        let k = cs(key);
        // SAFETY: live context; key NUL-terminated.
        unsafe { sys::gguf_set_val_bool(self.gguf.as_ptr(), k.as_ptr(), v) }
    }

    /// Sets a string array.
    pub fn set_str_array(&mut self, key: &str, v: &[String]) {
        let k = cs(key);
        let owned: Vec<CString> = v.iter().map(|s| cs(s)).collect();
        let mut ptrs: Vec<*const std::os::raw::c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: `ptrs` holds `v.len()` valid NUL-terminated strings for the call; gguf copies.
        unsafe {
            sys::gguf_set_arr_str(
                self.gguf.as_ptr(),
                k.as_ptr(),
                ptrs.as_mut_ptr(),
                ptrs.len(),
            )
        }
    }

    /// Sets an f32 array.
    pub fn set_f32_array(&mut self, key: &str, v: &[f32]) {
        let k = cs(key);
        // SAFETY: `v` is valid for `len` f32s; gguf copies them.
        unsafe {
            sys::gguf_set_arr_data(
                self.gguf.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_FLOAT32,
                v.as_ptr().cast(),
                v.len(),
            )
        }
    }

    /// Sets an i32 array.
    pub fn set_i32_array(&mut self, key: &str, v: &[i32]) {
        let k = cs(key);
        // SAFETY: `v` is valid for `len` i32s; gguf copies them.
        unsafe {
            sys::gguf_set_arr_data(
                self.gguf.as_ptr(),
                k.as_ptr(),
                sys::GGUF_TYPE_INT32,
                v.as_ptr().cast(),
                v.len(),
            )
        }
    }

    /// Adds a tensor descriptor (`ne` in ggml order, ne0 first).
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, ne: &[i64]) {
        assert!((1..=4).contains(&ne.len()), "tensor rank must be 1..=4");
        let n = cs(name);
        // SAFETY: the ggml context was sized for the descriptors added; `ne` holds `len` dims.
        unsafe {
            let t = sys::ggml_new_tensor(self.meta.as_ptr(), ty, ne.len() as i32, ne.as_ptr());
            assert!(!t.is_null(), "ggml context out of descriptor space");
            sys::ggml_set_name(t, n.as_ptr());
            sys::gguf_add_tensor(self.gguf.as_ptr(), t);
        }
    }

    /// Bytes of header (including padding up to the data section).
    pub fn meta_bytes(&self) -> Vec<u8> {
        // SAFETY: live context; the buffer is sized by gguf itself.
        unsafe {
            let n = sys::gguf_get_meta_size(self.gguf.as_ptr());
            let mut buf = vec![0u8; n];
            sys::gguf_get_meta_data(self.gguf.as_ptr(), buf.as_mut_ptr().cast());
            buf
        }
    }

    /// The tensors in file order with their offset within the data section and their size.
    pub fn tensors(&self) -> Vec<(String, u64, u64)> {
        tensor_table(self.gguf.as_ptr())
    }
}

fn tensor_table(ctx: *const sys::gguf_context) -> Vec<(String, u64, u64)> {
    // SAFETY: read-only queries on a live context with ids below the count.
    unsafe {
        let n = sys::gguf_get_n_tensors(ctx);
        (0..n)
            .map(|i| {
                let name = CStr::from_ptr(sys::gguf_get_tensor_name(ctx, i))
                    .to_string_lossy()
                    .into_owned();
                (
                    name,
                    sys::gguf_get_tensor_offset(ctx, i) as u64,
                    sys::gguf_get_tensor_size(ctx, i) as u64,
                )
            })
            .collect()
    }
}

/// A GGUF's header read without tensor data.
pub struct GgufFile {
    gguf: NonNull<sys::gguf_context>,
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: owned context freed once.
        unsafe { sys::gguf_free(self.gguf.as_ptr()) }
    }
}

/// What gguf's header reader reads from: the file, and the first error a read met.
struct HeaderSource {
    file: std::fs::File,
    error: Option<std::io::Error>,
}

/// gguf's read callback, over `pread`: the header is read where gguf asks and nowhere else. (With
/// a `FILE*`, gguf seeks to the end to size the file and glibc then reads the last block, which is
/// tensor data: on storage that hangs there, the header read hung too.)
unsafe extern "C" fn read_header_at(
    userdata: *mut std::ffi::c_void,
    output: *mut std::ffi::c_void,
    offset: u64,
    len: usize,
) -> usize {
    use std::os::unix::fs::FileExt;
    // SAFETY: `userdata` is the HeaderSource that `GgufFile::open` handed to
    // gguf_init_from_callback, alive and not otherwise borrowed during that call; `output` is a
    // buffer of `len` bytes gguf owns (an initialised value or vector it reads into).
    let (src, out) = unsafe {
        (
            &mut *userdata.cast::<HeaderSource>(),
            std::slice::from_raw_parts_mut(output.cast::<u8>(), len),
        )
    };
    let mut done = 0;
    while done < len {
        match src.file.read_at(&mut out[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                src.error.get_or_insert(e);
                break;
            }
        }
    }
    done
}

impl GgufFile {
    /// Reads the header of `path` (and only the header); on failure returns what gguf logged, or
    /// the read error that stopped it.
    pub fn open(path: &Path) -> Result<Self, FfiError> {
        super::backend_init();
        let io = |e: std::io::Error| FfiError::NoResult {
            call: "gguf_init_from_callback",
            logged: format!("reading the header failed: {e}"),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut src = HeaderSource { file, error: None };
        super::log::clear_recent();
        // SAFETY: the callback and its userdata (`src`, outliving the call) are as
        // `read_header_at` expects; `len` bounds every size gguf reads; `no_alloc` reads only the
        // header.
        let raw = unsafe {
            sys::gguf_init_from_callback(
                Some(read_header_at),
                std::ptr::from_mut(&mut src).cast(),
                0,
                len,
                sys::gguf_init_params {
                    no_alloc: true,
                    ctx: std::ptr::null_mut(),
                },
            )
        };
        NonNull::new(raw)
            .map(|gguf| Self { gguf })
            .ok_or_else(|| match src.error.take() {
                Some(e) => io(e),
                None => FfiError::no_result("gguf_init_from_callback", "unreadable GGUF header"),
            })
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        // SAFETY: read-only query.
        unsafe { sys::gguf_get_data_offset(self.gguf.as_ptr()) as u64 }
    }

    /// The tensors with their offset within the data section and their size.
    pub fn tensors(&self) -> Vec<(String, u64, u64)> {
        tensor_table(self.gguf.as_ptr())
    }

    /// A u32-like integer value (u8..u64, i8..i64), `None` when absent or not an integer.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        let k = cs(key);
        // SAFETY: read-only queries with a key id returned by gguf itself.
        unsafe {
            let id = sys::gguf_find_key(self.gguf.as_ptr(), k.as_ptr());
            if id < 0 {
                return None;
            }
            let c = self.gguf.as_ptr();
            Some(match sys::gguf_get_kv_type(c, id) {
                sys::GGUF_TYPE_UINT8 => sys::gguf_get_val_u8(c, id) as u64,
                sys::GGUF_TYPE_UINT16 => sys::gguf_get_val_u16(c, id) as u64,
                sys::GGUF_TYPE_UINT32 => sys::gguf_get_val_u32(c, id) as u64,
                sys::GGUF_TYPE_UINT64 => sys::gguf_get_val_u64(c, id),
                sys::GGUF_TYPE_INT8 => sys::gguf_get_val_i8(c, id) as u64,
                sys::GGUF_TYPE_INT16 => sys::gguf_get_val_i16(c, id) as u64,
                sys::GGUF_TYPE_INT32 => sys::gguf_get_val_i32(c, id) as u64,
                sys::GGUF_TYPE_INT64 => sys::gguf_get_val_i64(c, id) as u64,
                _ => return None,
            })
        }
    }

    /// A string value, `None` when absent or not a string.
    pub fn get_str(&self, key: &str) -> Option<String> {
        let k = cs(key);
        // SAFETY: read-only queries with a key id returned by gguf itself.
        unsafe {
            let c = self.gguf.as_ptr();
            let id = sys::gguf_find_key(c, k.as_ptr());
            if id < 0 || sys::gguf_get_kv_type(c, id) != sys::GGUF_TYPE_STRING {
                return None;
            }
            Some(
                CStr::from_ptr(sys::gguf_get_val_str(c, id))
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }
}

impl GgufBuilder {
    /// Sets a u16 value.
    pub fn set_u16(&mut self, key: &str, v: u16) {
        let k = cs(key);
        // SAFETY: live context; key NUL-terminated.
        unsafe { sys::gguf_set_val_u16(self.gguf.as_ptr(), k.as_ptr(), v) }
    }

    /// Sets an i32 value.
    pub fn set_i32(&mut self, key: &str, v: i32) {
        let k = cs(key);
        // SAFETY: live context; key NUL-terminated.
        unsafe { sys::gguf_set_val_i32(self.gguf.as_ptr(), k.as_ptr(), v) }
    }
}

/// The type of a metadata value: a scalar type, or an array with its element type and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    /// A single value of this gguf type.
    Scalar(sys::gguf_type),
    /// An array of `n` values of this gguf type.
    Array(sys::gguf_type, usize),
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Its ggml type.
    pub ty: GgmlType,
    /// Its shape in ggml order (ne0 first); unused dimensions are 1.
    pub ne: [i64; 4],
}

impl GgufFile {
    /// The type of `key`'s value, `None` when absent.
    pub fn kv_type(&self, key: &str) -> Option<KvType> {
        let k = CString::new(key).ok()?;
        let c = self.gguf.as_ptr();
        // SAFETY: read-only queries with a key id returned by gguf itself; the array queries are
        // made only for a key whose type is ARRAY (gguf asserts that).
        unsafe {
            let id = sys::gguf_find_key(c, k.as_ptr());
            if id < 0 {
                return None;
            }
            let t = sys::gguf_get_kv_type(c, id);
            Some(if t == sys::GGUF_TYPE_ARRAY {
                KvType::Array(sys::gguf_get_arr_type(c, id), sys::gguf_get_arr_n(c, id))
            } else {
                KvType::Scalar(t)
            })
        }
    }

    /// The strings of a string array, as bytes (a token need not be valid UTF-8); `None` when
    /// absent or not an array of strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<Vec<u8>>> {
        match self.kv_type(key)? {
            KvType::Array(t, _) if t == sys::GGUF_TYPE_STRING => {}
            _ => return None,
        }
        let k = CString::new(key).ok()?;
        let c = self.gguf.as_ptr();
        // SAFETY: the key is an array of strings (checked above, as gguf_get_arr_str asserts);
        // indices stay below its length; each string is NUL-terminated and owned by the context.
        unsafe {
            let id = sys::gguf_find_key(c, k.as_ptr());
            let n = sys::gguf_get_arr_n(c, id);
            Some(
                (0..n)
                    .map(|i| {
                        CStr::from_ptr(sys::gguf_get_arr_str(c, id, i))
                            .to_bytes()
                            .to_vec()
                    })
                    .collect(),
            )
        }
    }

    /// The values of an integer array (u8..i64 elements widened), `None` when absent or not an
    /// integer array.
    pub fn get_int_array(&self, key: &str) -> Option<Vec<i64>> {
        let (t, n) = match self.kv_type(key)? {
            KvType::Array(t, n) => (t, n),
            KvType::Scalar(_) => return None,
        };
        let width = match t {
            sys::GGUF_TYPE_UINT8 | sys::GGUF_TYPE_INT8 => 1,
            sys::GGUF_TYPE_UINT16 | sys::GGUF_TYPE_INT16 => 2,
            sys::GGUF_TYPE_UINT32 | sys::GGUF_TYPE_INT32 => 4,
            sys::GGUF_TYPE_UINT64 | sys::GGUF_TYPE_INT64 => 8,
            _ => return None,
        };
        let k = CString::new(key).ok()?;
        let c = self.gguf.as_ptr();
        // SAFETY: the key is a non-string array (checked above, as gguf_get_arr_data asserts) of
        // `n` elements of `width` bytes, owned by the context; copied out before it can go.
        let bytes = unsafe {
            let id = sys::gguf_find_key(c, k.as_ptr());
            let p = sys::gguf_get_arr_data(c, id) as *const u8;
            if p.is_null() {
                return None;
            }
            std::slice::from_raw_parts(p, n.checked_mul(width)?).to_vec()
        };
        Some(
            bytes
                .chunks_exact(width)
                .map(|b| match (t, b) {
                    (sys::GGUF_TYPE_UINT8, [a]) => i64::from(*a),
                    (sys::GGUF_TYPE_INT8, [a]) => i64::from(*a as i8),
                    (sys::GGUF_TYPE_UINT16, &[a, b]) => i64::from(u16::from_le_bytes([a, b])),
                    (sys::GGUF_TYPE_INT16, &[a, b]) => i64::from(i16::from_le_bytes([a, b])),
                    (sys::GGUF_TYPE_UINT32, &[a, b, c, d]) => {
                        i64::from(u32::from_le_bytes([a, b, c, d]))
                    }
                    (sys::GGUF_TYPE_INT32, &[a, b, c, d]) => {
                        i64::from(i32::from_le_bytes([a, b, c, d]))
                    }
                    (sys::GGUF_TYPE_UINT64, w) => {
                        let v = u64::from_le_bytes(w.try_into().unwrap_or([0xff; 8]));
                        i64::try_from(v).unwrap_or(i64::MAX)
                    }
                    (_, w) => i64::from_le_bytes(w.try_into().unwrap_or([0; 8])),
                })
                .collect(),
        )
    }

    /// A signed integer value (any integer type; u64 above i64::MAX saturates), `None` when
    /// absent or not an integer.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        let k = CString::new(key).ok()?;
        // SAFETY: read-only queries with a key id returned by gguf itself, each getter called for
        // the type gguf reports (gguf asserts the type).
        unsafe {
            let c = self.gguf.as_ptr();
            let id = sys::gguf_find_key(c, k.as_ptr());
            if id < 0 {
                return None;
            }
            Some(match sys::gguf_get_kv_type(c, id) {
                sys::GGUF_TYPE_UINT8 => i64::from(sys::gguf_get_val_u8(c, id)),
                sys::GGUF_TYPE_UINT16 => i64::from(sys::gguf_get_val_u16(c, id)),
                sys::GGUF_TYPE_UINT32 => i64::from(sys::gguf_get_val_u32(c, id)),
                sys::GGUF_TYPE_UINT64 => {
                    i64::try_from(sys::gguf_get_val_u64(c, id)).unwrap_or(i64::MAX)
                }
                sys::GGUF_TYPE_INT8 => i64::from(sys::gguf_get_val_i8(c, id)),
                sys::GGUF_TYPE_INT16 => i64::from(sys::gguf_get_val_i16(c, id)),
                sys::GGUF_TYPE_INT32 => i64::from(sys::gguf_get_val_i32(c, id)),
                sys::GGUF_TYPE_INT64 => sys::gguf_get_val_i64(c, id),
                _ => return None,
            })
        }
    }

    /// Every tensor's name, type and shape, in file order.
    pub fn tensor_infos(&self) -> Vec<TensorInfo> {
        let c = self.gguf.as_ptr();
        // SAFETY: read-only queries on a live context with ids below the count; the name is a
        // NUL-terminated string and `ne` points at GGML_MAX_DIMS values, both owned by the context.
        unsafe {
            let n = sys::gguf_get_n_tensors(c);
            (0..n)
                .map(|i| {
                    let ne_p = sys::gguf_get_tensor_ne(c, i);
                    let mut ne = [1i64; 4];
                    if !ne_p.is_null() {
                        ne.copy_from_slice(std::slice::from_raw_parts(ne_p, 4));
                    }
                    TensorInfo {
                        name: CStr::from_ptr(sys::gguf_get_tensor_name(c, i))
                            .to_string_lossy()
                            .into_owned(),
                        ty: sys::gguf_get_tensor_type(c, i),
                        ne,
                    }
                })
                .collect()
        }
    }
}

impl GgufFile {
    /// Every metadata key, in file order.
    pub fn keys(&self) -> Vec<String> {
        let c = self.gguf.as_ptr();
        // SAFETY: read-only queries with ids below the count; keys are NUL-terminated strings
        // owned by the context, copied out.
        unsafe {
            (0..sys::gguf_get_n_kv(c))
                .map(|i| {
                    CStr::from_ptr(sys::gguf_get_key(c, i))
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        }
    }

    /// A float value (f32 or f64), `None` when absent or not a float.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        let k = CString::new(key).ok()?;
        // SAFETY: read-only queries with a key id returned by gguf itself, each getter called for
        // the type gguf reports (gguf asserts the type).
        unsafe {
            let c = self.gguf.as_ptr();
            let id = sys::gguf_find_key(c, k.as_ptr());
            if id < 0 {
                return None;
            }
            match sys::gguf_get_kv_type(c, id) {
                sys::GGUF_TYPE_FLOAT32 => Some(f64::from(sys::gguf_get_val_f32(c, id))),
                sys::GGUF_TYPE_FLOAT64 => Some(sys::gguf_get_val_f64(c, id)),
                _ => None,
            }
        }
    }
}

/// A live gguf context the model loader may read (a file's header, or one built in memory).
pub(crate) trait GgufMeta {
    /// The context; it stays valid while `self` lives.
    fn raw(&self) -> *mut sys::gguf_context;
}

impl GgufMeta for GgufFile {
    fn raw(&self) -> *mut sys::gguf_context {
        self.gguf.as_ptr()
    }
}

impl GgufMeta for GgufBuilder {
    fn raw(&self) -> *mut sys::gguf_context {
        self.gguf.as_ptr()
    }
}
