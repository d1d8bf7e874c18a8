//! Binds the one header the pinned sys crate does not: `ggml-rpc.h`, and compiles the C++ shim
//! (`shim/bmoe_shim.cpp`) that keeps llama.cpp's exceptions from unwinding into Rust.
//!
//! The headers are installed under the sys crate's OUT_DIR; it exports `<OUT_DIR>/lib/cmake` as
//! `DEP_LLAMA_GGML_CMAKE_DIR`, from which the include folder is two levels up.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    let cmake_dir =
        PathBuf::from(env::var("DEP_LLAMA_GGML_CMAKE_DIR").expect(
            "llama-cpp-sys-2 did not export ggml_cmake_dir (is it built with system-ggml?)",
        ));
    let include = cmake_dir
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("include"))
        .expect("ggml_cmake_dir has no grandparent");
    // The folder of llama.cpp's shared libraries in a shared build (the default cpu-variants one):
    // `DEP_BMOE_GGML_SYS_LLAMA_LIB_DIR` for the runner's build script, which gives the bmoe
    // executable an rpath to it (cargo puts only dangling symlinks next to the executable).
    if let Some(lib) = cmake_dir.parent() {
        println!("cargo:llama_lib_dir={}", lib.display());
    }
    if let Some(lib) = cmake_dir.parent() {
        remove_dangling_links(lib);
    }
    let header = include.join("ggml-rpc.h");
    assert!(
        header.exists(),
        "{} is missing: llama-cpp-sys-2 was built without GGML_RPC=ON (see .cargo/config.toml; \
         `cargo clean -p llama-cpp-sys-2` to reconfigure)",
        header.display()
    );
    println!("cargo:rerun-if-changed={}", header.display());
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    // The shim compiles against the headers the sys crate installed, the same ones its libraries
    // were built from; nothing here touches the sys crate's own build (no llama.cpp rebuild).
    let shim = PathBuf::from("shim/bmoe_shim.cpp");
    println!("cargo:rerun-if-changed={}", shim.display());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(&include)
        .warnings(true)
        .file(&shim)
        .compile("bmoe_shim");
    // The shim files that read llama.cpp's internal structures compile against the headers
    // of the source tree the sys crate's CMake build was configured from (its CMakeCache), so the
    // layouts are the ones the libraries were compiled with.
    let source = llama_source_tree(&cmake_dir);
    let unlink = PathBuf::from("shim/bmoe_unlink.cpp");
    let weights = PathBuf::from("shim/bmoe_weights.cpp");
    println!("cargo:rerun-if-changed={}", unlink.display());
    println!("cargo:rerun-if-changed={}", weights.display());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(source.join("src"))
        .include(source.join("include"))
        .include(source.join("ggml/include"))
        .warnings(true)
        .file(&unlink)
        .file(&weights)
        .compile("bmoe_unlink");
    bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("ggml_backend_rpc_.*")
        .allowlist_recursively(false)
        .raw_line("#[allow(unused_imports)] use llama_cpp_sys_2::*;")
        .generate()
        .expect("bindgen over ggml-rpc.h")
        .write_to_file(out.join("rpc.rs"))
        .expect("write rpc.rs");
}

/// The llama.cpp source tree the sys crate built: `CMAKE_HOME_DIRECTORY` of its CMake build, which
/// sits two levels above the exported cmake folder (`<OUT_DIR>/lib/cmake` -> `<OUT_DIR>/build`).
fn llama_source_tree(cmake_dir: &std::path::Path) -> PathBuf {
    let cache = cmake_dir
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("build").join("CMakeCache.txt"))
        .expect("ggml_cmake_dir has no grandparent");
    println!("cargo:rerun-if-changed={}", cache.display());
    let text = std::fs::read_to_string(&cache)
        .unwrap_or_else(|e| panic!("reading {}: {e}", cache.display()));
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .unwrap_or_else(|| panic!("{} names no CMAKE_HOME_DIRECTORY", cache.display()));
    let dir = PathBuf::from(dir);
    assert!(
        dir.join("src/llama-model.h").exists(),
        "{} holds no src/llama-model.h (from {})",
        dir.display(),
        cache.display()
    );
    dir
}

/// In a shared build (the default cpu-variants one) llama-cpp-sys-2's build script hard-links
/// `lib{llama,ggml,ggml-base}.so` into the target folder, `deps/` and `examples/`; they are
/// symlinks to sonames it never links there, so they dangle, and its next run (after `cargo clean
/// -p llama-cpp-sys-2`, a changed GGML_* variable) panics on them with EEXIST. They serve nothing
/// (the executables find the libraries through the rpath or cargo's library path), so they go.
fn remove_dangling_links(lib: &std::path::Path) {
    let Some(profile_dir) = env::var_os("OUT_DIR")
        .map(PathBuf::from)
        .and_then(|o| o.ancestors().nth(3).map(std::path::Path::to_path_buf))
    else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(lib) else {
        return;
    };
    let names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    for dir in [
        profile_dir.clone(),
        profile_dir.join("deps"),
        profile_dir.join("examples"),
    ] {
        for name in &names {
            let p = dir.join(name);
            let dangling = p
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
                && !p.exists();
            if dangling {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}
