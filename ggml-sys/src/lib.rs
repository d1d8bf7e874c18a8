//! FFI to llama.cpp and ggml as built by the pinned `llama-cpp-sys-2`, plus what that crate leaves out:
//! the `ggml-rpc.h` declarations and the `#define` constants bindgen drops.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::all
)]

pub use llama_cpp_sys_2::*;

/// `ggml-rpc.h`, bound by this crate's build script (the symbols live in the sys crate's `libggml-rpc.a`).
pub mod rpc {
    #![allow(
        non_camel_case_types,
        non_upper_case_globals,
        non_snake_case,
        dead_code,
        clippy::all
    )]
    include!(concat!(env!("OUT_DIR"), "/rpc.rs"));
}

/// `GGML_MAX_DIMS` from ggml.h.
pub const GGML_MAX_DIMS: usize = 4;
/// `GGML_MAX_NAME` from ggml.h: a tensor name's buffer, terminator included.
pub const GGML_MAX_NAME: usize = 64;
/// `GGML_MAX_SRC` from ggml.h.
pub const GGML_MAX_SRC: usize = 10;
/// `GGML_MAX_OP_PARAMS` from ggml.h, in bytes.
pub const GGML_MAX_OP_PARAMS: usize = 64;
/// `LLAMA_TOKEN_NULL` from llama.h.
pub const LLAMA_TOKEN_NULL: llama_token = -1;
/// `LLAMA_DEFAULT_SEED` from llama.h.
pub const LLAMA_DEFAULT_SEED: u32 = 0xFFFF_FFFF;
/// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` from llama.h.
pub const LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: u32 = 1;
/// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` from llama.h.
pub const LLAMA_STATE_SEQ_FLAGS_ON_DEVICE: u32 = 2;
/// `GGUF_DEFAULT_ALIGNMENT` from gguf.h.
pub const GGUF_DEFAULT_ALIGNMENT: usize = 32;
/// The RPC registry's proc name for `ggml_backend_rpc_add_server`.
pub const RPC_PROC_ADD_SERVER: &std::ffi::CStr = c"ggml_backend_rpc_add_server";
/// The RPC registry's proc name for `ggml_backend_rpc_start_server`.
pub const RPC_PROC_START_SERVER: &std::ffi::CStr = c"ggml_backend_rpc_start_server";

/// Signature of `ggml_backend_rpc_add_server`, as fetched through the registry.
pub type RpcAddServerFn =
    unsafe extern "C" fn(endpoint: *const std::os::raw::c_char) -> ggml_backend_reg_t;
/// Signature of `ggml_backend_rpc_start_server` (the 5-parameter form of RPC protocol 7).
pub type RpcStartServerFn = unsafe extern "C" fn(
    endpoint: *const std::os::raw::c_char,
    cache_dir: *const std::os::raw::c_char,
    n_threads: usize,
    n_devices: usize,
    devices: *mut ggml_backend_dev_t,
);

/// Link-time stand-ins for the CPU backend's threadpool functions in a `GGML_BACKEND_DL` build
/// (feature `dynamic-backends`, used by `scripts/build-device-bundle`). There the CPU backend is a
/// module (`libggml-cpu.so`) that `ggml_backend_load_all` opens at run time, so nothing exports
/// these symbols at link time; ggml's own answer is the CPU registry's `get_proc_address`
/// (`ggml-cpu.cpp`, "threadpool - TODO: move to ggml-base"), which these forward to. Without a
/// registered CPU backend `ggml_threadpool_new` returns NULL, which callers already treat as "no
/// pool". The executable does not export these, so the module's own references stay its own.
#[cfg(feature = "dynamic-backends")]
mod dl_cpu {
    use super::{
        ggml_backend_reg_by_name, ggml_backend_reg_get_proc_address, ggml_threadpool_params,
        ggml_threadpool_t,
    };
    use std::ffi::{c_void, CStr};

    unsafe fn cpu_proc(name: &CStr) -> *mut c_void {
        let reg = ggml_backend_reg_by_name(c"CPU".as_ptr());
        if reg.is_null() {
            return std::ptr::null_mut();
        }
        ggml_backend_reg_get_proc_address(reg, name.as_ptr())
    }

    #[no_mangle]
    pub unsafe extern "C" fn ggml_threadpool_new(
        params: *mut ggml_threadpool_params,
    ) -> ggml_threadpool_t {
        let f = cpu_proc(c"ggml_threadpool_new");
        if f.is_null() {
            return std::ptr::null_mut();
        }
        let f: unsafe extern "C" fn(*mut ggml_threadpool_params) -> ggml_threadpool_t =
            std::mem::transmute(f);
        f(params)
    }

    #[no_mangle]
    pub unsafe extern "C" fn ggml_threadpool_free(pool: ggml_threadpool_t) {
        let f = cpu_proc(c"ggml_threadpool_free");
        if !f.is_null() && !pool.is_null() {
            let f: unsafe extern "C" fn(ggml_threadpool_t) = std::mem::transmute(f);
            f(pool)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_name_buffer_matches_max_name() {
        // SAFETY: ggml_tensor is plain old data; a zeroed value is a valid bit pattern.
        let t: ggml_tensor = unsafe { std::mem::zeroed() };
        assert_eq!(t.name.len(), GGML_MAX_NAME);
        assert_eq!(t.src.len(), GGML_MAX_SRC);
        assert_eq!(t.ne.len(), GGML_MAX_DIMS);
    }

    #[test]
    fn rpc_registry_entry_and_procs_are_present() {
        // SAFETY: registry lookups only read static tables built at first use; the names are
        // NUL-terminated literals.
        unsafe {
            let reg = ggml_backend_reg_by_name(c"RPC".as_ptr());
            assert!(
                !reg.is_null(),
                "RPC backend not registered: build without GGML_RPC=ON?"
            );
            for name in [RPC_PROC_ADD_SERVER, RPC_PROC_START_SERVER] {
                let p = ggml_backend_reg_get_proc_address(reg, name.as_ptr());
                assert!(!p.is_null(), "proc {name:?} missing");
            }
            // The statically linked symbol and the registry agree.
            assert!(rpc::ggml_backend_rpc_reg() == reg);
        }
    }
}
