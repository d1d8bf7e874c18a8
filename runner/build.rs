//! Build identity for the telemetry rows: the git commit of the checkout (`BMOE_GIT_COMMIT`) and
//! the llama.cpp pin from Cargo.lock (`BMOE_LLAMA_CPP`). Outside a git checkout (a source tarball)
//! the commit is `unknown`, or whatever `BMOE_GIT_COMMIT` says in the build's environment.
use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-env-changed=BMOE_GIT_COMMIT");
    let commit = match std::env::var("BMOE_GIT_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(c) => {
                // Rebuild when HEAD moves (a commit, a checkout) or the index changes (git add).
                if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                    let d = Path::new(&dir);
                    println!("cargo:rerun-if-changed={}", d.join("HEAD").display());
                    println!("cargo:rerun-if-changed={}", d.join("index").display());
                    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                        println!("cargo:rerun-if-changed={}", d.join(&r).display());
                    }
                }
                // `-dirty` is decided when this script runs (HEAD or the index changed, or a clean
                // build): an edit that was never `git add`ed does not rerun it. Without optional
                // locks `git status` leaves the index as it is: in a fresh clone it would rewrite
                // it (refreshed file times), and the next cargo command would see the index
                // changed and build this crate again (a fuzz build's second target, 2m22s).
                let dirty = git(&[
                    "--no-optional-locks",
                    "status",
                    "--porcelain",
                    "--untracked-files=no",
                ])
                .map(|s| !s.is_empty())
                .unwrap_or(false);
                if dirty {
                    format!("{c}-dirty")
                } else {
                    c
                }
            }
            None => "unknown".to_string(),
        },
    };
    println!("cargo:rustc-env=BMOE_GIT_COMMIT={commit}");

    let lock = manifest.join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let version = text
        .split("[[package]]")
        .find(|p| p.contains("name = \"llama-cpp-sys-2\""))
        .and_then(|p| {
            p.lines()
                .find_map(|l| l.trim().strip_prefix("version = \""))
                .map(|v| v.trim_end_matches('"').to_string())
        });
    let llama = match version {
        Some(v) => format!("llama-cpp-sys-2 {v}"),
        None => "llama-cpp-sys-2 (version unknown)".to_string(),
    };
    println!("cargo:rustc-env=BMOE_LLAMA_CPP={llama}");

    // In the default build llama.cpp is a set of shared libraries (libllama, libggml, libggml-base)
    // in llama-cpp-sys-2's OUT_DIR/lib: `cargo run`/`cargo test` put that folder on the library
    // path, a direct `target/release/bmoe` finds it through this rpath (and next to itself, for a
    // copied bundle).
    // DT_RPATH (--disable-new-dtags), not DT_RUNPATH: it also serves the libraries' own needs
    // (libllama -> libggml-base), which a RUNPATH of the executable does not.
    println!("cargo:rerun-if-env-changed=DEP_BMOE_GGML_SYS_LLAMA_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_CPU_VARIANTS").is_some() {
        if let Ok(dir) = std::env::var("DEP_BMOE_GGML_SYS_LLAMA_LIB_DIR") {
            println!("cargo:rustc-link-arg-bins=-Wl,--disable-new-dtags,-rpath,$ORIGIN:{dir}");
        }
    }
}
