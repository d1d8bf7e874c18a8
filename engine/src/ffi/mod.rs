//! The thin unsafe layer: safe wrappers over llama.cpp and ggml. Every `unsafe` block in the
//! engine lives under this folder and says why it is sound.
pub mod affinity;
pub mod amx;
pub mod batch;
pub mod buffer;
pub mod context;
// Read by the x86 module loader only; the static build keeps its tests.
#[cfg_attr(
    not(all(feature = "cpu-variants", target_arch = "x86_64")),
    allow(dead_code)
)]
pub mod cpu_select;
pub mod cpu_variant;
pub mod error;
pub mod file_map;
pub mod gguf;
pub mod gguf_copy;
pub mod guard;
pub mod heap;
pub mod kv;
pub mod log;
pub mod mapped_fault;
pub mod model;
pub mod module_report;
#[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
pub mod modules;
pub mod page_cache;
pub mod probe;
#[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
mod probe_memo;
pub mod quant;
pub mod quiet;
pub mod region;
pub mod registry;
pub mod repack;
pub mod routing;
pub mod rpc;
pub mod sampler;
#[cfg(feature = "test-support")]
pub mod stock_reference;
pub mod tensor;
pub mod tokenizer;
pub mod vocab;

use std::sync::Once;

static INIT: Once = Once::new();

/// Initialises llama.cpp's backends and routes its log through the engine; idempotent.
pub fn backend_init() {
    INIT.call_once(|| {
        // Before any threadpool can pin this thread.
        affinity::process_cpus();
        log::install();
        // Before any model file is mapped: a failed page read is then an error, not a crash.
        mapped_fault::install();
        // ggml's modules, the CPU variant chosen by bmoe (llama_backend_init then loads nothing).
        #[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
        modules::load();
        // SAFETY: called exactly once per process (guarded by `Once`) before any other llama call.
        unsafe { ggml_sys::llama_backend_init() };
    });
}
