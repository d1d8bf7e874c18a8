//! The rpath of the engine's examples (`bench_prefill`, `stock_llama`, ...) in the default build,
//! where llama.cpp is a set of shared libraries in llama-cpp-sys-2's OUT_DIR/lib (ggml-sys exports
//! the folder): the benchmark scripts run `target/release/examples/*` directly, outside cargo's
//! library path.
fn main() {
    // DT_RPATH (--disable-new-dtags), not DT_RUNPATH: it also serves the libraries' own needs
    // (libllama -> libggml-base), which a RUNPATH of the executable does not.
    println!("cargo:rerun-if-env-changed=DEP_BMOE_GGML_SYS_LLAMA_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_CPU_VARIANTS").is_some() {
        if let Ok(dir) = std::env::var("DEP_BMOE_GGML_SYS_LLAMA_LIB_DIR") {
            println!("cargo:rustc-link-arg-examples=-Wl,--disable-new-dtags,-rpath,$ORIGIN:{dir}");
        }
    }
}
