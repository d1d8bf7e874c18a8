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

/// The C++ shim (`shim/bmoe_shim.cpp`): llama.cpp entry points that can throw, wrapped so that no
/// C++ exception unwinds into Rust. Each returns [`shim::BMOE_OK`] or [`shim::BMOE_THREW`]; on a
/// throw the exception's message is in `err` (NUL-terminated, truncated to `err_len`) and the
/// out-parameters hold nothing useful (pointers are set to NULL first).
pub mod shim {
    use super::*;
    use std::os::raw::c_char;

    /// The call returned normally; its result is in the out-parameter.
    pub const BMOE_OK: i32 = 0;
    /// The call threw; the message is in `err`.
    pub const BMOE_THREW: i32 = 1;

    extern "C" {
        /// `llama_model_load_from_file`, guarded.
        pub fn bmoe_model_load_from_file(
            path: *const c_char,
            params: llama_model_params,
            out: *mut *mut llama_model,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_model_init_from_user`, guarded: a model built from `metadata` whose tensor data
        /// `set_data` provides (or not) instead of the file.
        pub fn bmoe_model_init_from_user(
            metadata: *mut gguf_context,
            set_data: llama_model_set_tensor_data_t,
            set_data_ud: *mut std::os::raw::c_void,
            params: llama_model_params,
            out: *mut *mut llama_model,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_init_from_model`, guarded.
        pub fn bmoe_init_from_model(
            model: *mut llama_model,
            params: llama_context_params,
            out: *mut *mut llama_context,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_decode`, guarded; its return code goes to `out`.
        pub fn bmoe_decode(
            ctx: *mut llama_context,
            batch: llama_batch,
            out: *mut i32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_tokenize`, guarded; its return value goes to `out`.
        pub fn bmoe_tokenize(
            vocab: *const llama_vocab,
            text: *const c_char,
            text_len: i32,
            tokens: *mut llama_token,
            n_tokens_max: i32,
            add_special: bool,
            parse_special: bool,
            out: *mut i32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_token_to_piece`, guarded; its return value goes to `out`.
        pub fn bmoe_token_to_piece(
            vocab: *const llama_vocab,
            token: llama_token,
            buf: *mut c_char,
            length: i32,
            lstrip: i32,
            special: bool,
            out: *mut i32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_chat_apply_template`, guarded; its return value goes to `out`.
        pub fn bmoe_chat_apply_template(
            tmpl: *const c_char,
            chat: *const llama_chat_message,
            n_msg: usize,
            add_ass: bool,
            buf: *mut c_char,
            length: i32,
            out: *mut i32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_model_chat_template(model, NULL)`, guarded.
        pub fn bmoe_model_chat_template(
            model: *const llama_model,
            out: *mut *const c_char,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// A sampler chain built in one guarded call: greedy, or top-k/top-p/temp/dist.
        pub fn bmoe_sampler_chain_new(
            greedy: bool,
            seed: u32,
            temperature: f32,
            top_k: i32,
            top_p: f32,
            out: *mut *mut llama_sampler,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_sampler_sample`, guarded.
        pub fn bmoe_sampler_sample(
            smpl: *mut llama_sampler,
            ctx: *mut llama_context,
            idx: i32,
            out: *mut llama_token,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_model_free`, guarded.
        pub fn bmoe_model_free(model: *mut llama_model, err: *mut c_char, err_len: usize) -> i32;
        /// `llama_free`, guarded.
        pub fn bmoe_free(ctx: *mut llama_context, err: *mut c_char, err_len: usize) -> i32;
        /// `llama_memory_clear(llama_get_memory(ctx), true)`, guarded.
        pub fn bmoe_memory_clear(ctx: *mut llama_context, err: *mut c_char, err_len: usize) -> i32;
        /// `llama_state_seq_get_size`, guarded; the size goes to `out`.
        pub fn bmoe_state_seq_get_size(
            ctx: *mut llama_context,
            seq: llama_seq_id,
            out: *mut usize,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_state_seq_get_data`, guarded; the bytes written go to `out`.
        pub fn bmoe_state_seq_get_data(
            ctx: *mut llama_context,
            dst: *mut u8,
            size: usize,
            seq: llama_seq_id,
            out: *mut usize,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_state_seq_set_data`, guarded; the bytes read go to `out`.
        pub fn bmoe_state_seq_set_data(
            ctx: *mut llama_context,
            src: *const u8,
            size: usize,
            seq: llama_seq_id,
            out: *mut usize,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_memory_seq_rm(llama_get_memory(ctx), ...)`, guarded; its result goes to `out`.
        pub fn bmoe_memory_seq_rm(
            ctx: *mut llama_context,
            seq: llama_seq_id,
            p0: llama_pos,
            p1: llama_pos,
            out: *mut bool,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_memory_seq_cp(llama_get_memory(ctx), ...)`, guarded.
        pub fn bmoe_memory_seq_cp(
            ctx: *mut llama_context,
            src: llama_seq_id,
            dst: llama_seq_id,
            p0: llama_pos,
            p1: llama_pos,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// `llama_set_adapter_cvec`, guarded; its return value goes to `out`.
        pub fn bmoe_set_adapter_cvec(
            ctx: *mut llama_context,
            data: *const f32,
            len: usize,
            n_embd: i32,
            il_start: i32,
            il_end: i32,
            out: *mut i32,
            err: *mut c_char,
            err_len: usize,
        ) -> i32;
        /// Throws `std::out_of_range("bmoe shim self-test")` through the guard (tests only).
        pub fn bmoe_shim_selftest(err: *mut c_char, err_len: usize) -> i32;
        /// Clears every reference `model`'s layers and model-level members hold to one of the
        /// `n_absent` tensors at `absent` (`shim/bmoe_unlink.cpp`); `n_unlinked` counts them.
        /// Returns [`UNLINK_OK`], or [`UNLINK_DECLINED`] with nothing changed.
        pub fn bmoe_model_unlink_absent(
            model: *mut llama_model,
            absent: *const *mut ggml_tensor,
            n_absent: usize,
            n_unlinked: *mut usize,
        ) -> i32;
        /// Counts `model`'s weight tensors held in a buffer of the buffer type named `buft_name`
        /// and their bytes (`shim/bmoe_weights.cpp`). Returns 0, or 1 (nothing counted) on a
        /// throw.
        pub fn bmoe_model_weights_in(
            model: *const llama_model,
            buft_name: *const c_char,
            n_tensors: *mut usize,
            n_bytes: *mut u64,
        ) -> i32;
    }

    /// The references were cleared.
    pub const UNLINK_OK: i32 = 0;
    /// Nothing was changed: a layer slot held something other than one of the model's tensors,
    /// or a tensor to unlink was not the model's.
    pub const UNLINK_DECLINED: i32 = 2;
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
    fn shim_turns_a_cpp_exception_into_an_error_code() {
        let mut err = [0 as std::os::raw::c_char; 128];
        // SAFETY: the buffer is valid for its length; the shim writes a NUL-terminated message.
        let (rc, msg) = unsafe {
            let rc = shim::bmoe_shim_selftest(err.as_mut_ptr(), err.len());
            (
                rc,
                std::ffi::CStr::from_ptr(err.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        assert_eq!(rc, shim::BMOE_THREW);
        assert_eq!(msg, "bmoe shim self-test");
    }

    #[test]
    fn rpc_registry_entry_and_procs_are_present() {
        // In a GGML_BACKEND_DL build the RPC backend is a module in the build's module folder,
        // registered once loaded (the engine's loader does this at start).
        #[cfg(feature = "dynamic-backends")]
        if let Some(dir) = BACKENDS_DIR {
            let path = std::ffi::CString::new(format!("{dir}/libggml-rpc.so")).unwrap();
            // SAFETY: a NUL-terminated path; ggml returns NULL when it cannot load the module.
            let reg = unsafe { ggml_backend_load(path.as_ptr()) };
            assert!(!reg.is_null(), "{path:?} did not load");
        }
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
            // The statically linked symbol and the registry agree (in a GGML_BACKEND_DL build the
            // RPC backend is a module: its symbols are reached through the registry only).
            #[cfg(not(feature = "dynamic-backends"))]
            assert!(rpc::ggml_backend_rpc_reg() == reg);
        }
    }
}
