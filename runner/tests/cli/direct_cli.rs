//! The one-shot commands through the real binary: output, exit codes, and errors that are
//! messages, never panics or backtraces.
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;

fn bmoe(args: &[&str]) -> Output {
    common::bmoe_command()
        .args(args)
        .output()
        .expect("run bmoe")
}

/// The shared tiny model (written by the library; `synth_cli_writes_the_library_bytes` checks
/// the command writes the same file).
fn tiny() -> PathBuf {
    common::model_path()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Asserts a clean failure: exit 2, one `error:` line with `needle`, no panic, no backtrace.
fn assert_clean_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    for bad in ["panicked", "stack backtrace", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "{bad} in {err}");
    }
}

#[test]
fn devices_lists_the_cpu_and_the_rpc_backend() {
    let o = bmoe(&["devices"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("CPU"), "{out}");
    assert!(out.contains("RPC"), "{out}");
    // Whether a device offers a host buffer type (the CPU's own is its plain memory: no).
    assert!(out.contains("host buffer"), "{out}");
    let o = bmoe(&["devices", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["devices"][0]["host_buffer"], false, "{v}");
    assert_eq!(v["devices"][0]["computes_on_host_buffer"], false, "{v}");
}

/// The CPU kernels in use and the page-move self-check's verdict: the default x86 build loads the
/// CPU variant module bmoe chose (the static build links its CPU backend in), and this kernel (5.7
/// or later, not emulated) moves pages.
#[test]
fn devices_names_the_cpu_variant_and_the_page_moves() {
    let variants = cfg!(all(feature = "cpu-variants", target_arch = "x86_64"));
    let o = bmoe(&["devices"]);
    let out = String::from_utf8_lossy(&o.stdout);
    if variants {
        // One of ggml's x86 levels, and where the modules came from.
        assert!(!out.contains("\ncpu variant: built-in:"), "{out}");
        assert!(
            out.contains("\nmodules: libggml-rpc.so libggml-cpu-"),
            "{out}"
        );
    } else {
        assert!(out.contains("\ncpu variant: built-in:"), "{out}");
    }
    assert!(out.contains("\npage moves: move ("), "{out}");
    // This build's CPU backend has llama.cpp's repacked layouts (GGML_CPU_REPACK is on).
    assert!(out.contains("\nrepack: CPU_REPACK ("), "{out}");
    // Without the Vulkan module (scripts/build-vulkan) the line says how to get it; with it,
    // Vulkan is among the backends.
    let vulkan_loaded = out
        .lines()
        .any(|l| l.starts_with("backends: ") && l.contains("Vulkan"));
    if !vulkan_loaded {
        let how = if variants {
            "\nvulkan: no module (libggml-vulkan.so) beside the CPU variants: scripts/build-vulkan"
        } else {
            "\nvulkan: not in this build"
        };
        assert!(out.contains(how), "{out}");
    }
    let o = bmoe(&["devices", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    if variants {
        let chosen = &v["backend_modules"]["cpu_variant"];
        assert_eq!(v["cpu_variant"]["variant"], *chosen, "{v}");
    } else {
        assert_eq!(v["cpu_variant"]["variant"], "built-in", "{v}");
    }
    assert_eq!(v["cpu_repack"], true, "{v}");
    assert!(v["cpu_variant"]["features"].is_array(), "{v}");
    assert_eq!(v["page_moves"], "move", "{v}");
}

fn chosen_variant(env: &[(&str, &str)]) -> (String, serde_json::Value, String) {
    let o = common::bmoe_command()
        .args(["devices", "--json"])
        .envs(env.iter().copied())
        .output()
        .expect("run bmoe");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let name = v["backend_modules"]["cpu_variant"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (name, v, err)
}

/// A CPU variant whose probe traps (made to on purpose: BMOE_CPU_PROBE_FAULT) is skipped for the
/// next best, with a `bmoe:` line saying which and why; `--version` names the variant in use.
#[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
#[test]
fn a_cpu_variant_that_traps_is_skipped_for_the_next_best() {
    // (On this machine the AMX variant, sapphirerapids, traps by itself: its line is there on
    // every run, and the best is the AVX-512 VNNI variant after it.)
    let (best, v, err) = chosen_variant(&[]);
    assert!(!best.is_empty(), "{v}");
    assert!(!err.contains(&format!("variant {best}:")), "{err}");
    assert_eq!(
        v["backend_modules"]["dir"]
            .as_str()
            .map(|d| d.ends_with("/backends")),
        Some(true),
        "the build's module folder: {v}"
    );
    let (next, v, err) = chosen_variant(&[("BMOE_CPU_PROBE_FAULT", &best)]);
    assert_ne!(next, best, "{v}");
    assert!(!next.is_empty(), "{v}");
    let line = format!("bmoe: CPU variant {best}: its probe matmul died of SIGILL");
    assert!(err.contains(&line), "{err}");
    assert!(err.contains(&format!("; using {next}")), "{err}");
    let skipped = v["backend_modules"]["skipped"].to_string();
    assert!(skipped.contains(&best), "{v}");
    // Every variant trapping: no CPU backend, said plainly, and no crash.
    let all = "x64,sse42,sandybridge,ivybridge,piledriver,haswell,skylakex,cannonlake,cascadelake,\
               icelake,cooperlake,zen4,alderlake,sapphirerapids";
    let o = common::bmoe_command()
        .args(["--version"])
        .env("BMOE_CPU_PROBE_FAULT", all)
        .output()
        .expect("run bmoe");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bmoe: no runnable CPU module in "), "{err}");
    // A variant named by BMOE_CPU_VARIANT is tried first; --version names it.
    let o = common::bmoe_command()
        .args(["--version"])
        .env("BMOE_CPU_VARIANT", "haswell")
        .output()
        .expect("run bmoe");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\ncpu variant: haswell: "), "{out}");
    assert!(out.contains("libggml-cpu-haswell.so from "), "{out}");
}

/// The probe's verdicts are remembered per machine state (a file in BMOE_CPU_PROBE_CACHE's folder):
/// a second start probes nothing and says nothing about skipped variants, the file's verdicts are
/// the ones used (a planted one moves the choice), and `--version` names the file.
#[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
#[test]
fn the_probe_verdicts_are_remembered_and_said_once() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().to_str().unwrap();
    let (best, v, _) = chosen_variant(&[("BMOE_CPU_PROBE_CACHE", cache)]);
    let files: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one file per machine state: {files:?}");
    let file = files[0].path();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(&format!("\n{best}\tok\n")), "{text}");
    let (again, v2, err) = chosen_variant(&[("BMOE_CPU_PROBE_CACHE", cache)]);
    assert_eq!(again, best);
    assert!(!err.contains("bmoe: CPU variant "), "said once: {err}");
    assert_eq!(
        v["backend_modules"]["skipped"],
        v2["backend_modules"]["skipped"]
    );
    // A remembered failure is believed: the next best is used, silently, and listed.
    std::fs::write(&file, format!("{best}\tskip\tplanted by the test\n")).unwrap();
    let (next, v3, err) = chosen_variant(&[("BMOE_CPU_PROBE_CACHE", cache)]);
    assert_ne!(next, best, "{v3}");
    assert!(!err.contains(&format!("CPU variant {best}")), "{err}");
    let skipped = v3["backend_modules"]["skipped"].to_string();
    assert!(
        skipped.contains(&format!("{best}: planted by the test")),
        "{v3}"
    );
    let o = common::bmoe_command()
        .arg("--version")
        .env("BMOE_CPU_PROBE_CACHE", cache)
        .output()
        .expect("run bmoe");
    let out = String::from_utf8_lossy(&o.stdout);
    let named = format!("; probe verdicts remembered in {}", file.display());
    assert!(out.contains(&named), "{out}");
}

#[test]
fn generate_twice_gives_the_same_bytes() {
    let m = tiny();
    let run = || {
        bmoe(&[
            "generate",
            "-m",
            s(&m),
            "-p",
            "Hello",
            "-n",
            "16",
            "-t",
            "2",
        ])
    };
    let (a, b) = (run(), run());
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(a.stdout.len() > 1);
    assert_eq!(a.stdout, b.stdout);
    assert!(String::from_utf8_lossy(&a.stderr).contains("decode: "));
}

#[test]
fn an_unknown_prefill_device_on_the_command_line_is_an_error() {
    let m = tiny();
    // As llama.cpp refuses an unknown --device: a typo must not measure the CPU in silence.
    let o = bmoe(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "Hi",
        "-n",
        "8",
        "--device",
        "CUDAO",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", common::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("prefill device CUDAO")
            && err.contains("is not in this build's registry")
            && err.contains("--allow-cpu-fallback"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "nothing generated");
}

#[test]
fn an_unknown_prefill_device_with_fallback_allowed_runs_on_the_cpu_with_one_line() {
    let m = tiny();
    let plain = bmoe(&["generate", "-m", s(&m), "-p", "Hi", "-n", "8", "-t", "2"]);
    let o = bmoe(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "Hi",
        "-n",
        "8",
        "-t",
        "2",
        "--prefill-device",
        "HTP0",
        "--allow-cpu-fallback",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    // (A CPU variant skipped at start has its own line, on every run of a machine where one
    // traps: not this test's business.)
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("bmoe: ") && !l.starts_with("bmoe: CPU variant "))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("HTP0 is not in this build's registry"),
        "{err}"
    );
    assert_eq!(o.stdout, plain.stdout);
}

#[test]
fn decide_and_ppl_print_their_results() {
    let m = tiny();
    let o = bmoe(&[
        "decide",
        "-m",
        s(&m),
        "--prefix",
        "Pick. ",
        "--suffix",
        "A or B?",
        "--choice",
        "A",
        "--choice",
        "B",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["best"].as_u64().unwrap() < 2);
    assert_eq!(v["choice_logp"].as_array().unwrap().len(), 2);
    let text = m.with_file_name("text.txt");
    std::fs::write(&text, "one two three four five six seven eight nine ten").unwrap();
    let o = bmoe(&["ppl", "-m", s(&m), s(&text)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("perplexity: "));
}

/// `generate --format json` carries the numbers its stderr lines show beside the record (the
/// load's cost, the expert cache, the peak resident set): what the bench scripts read (issue 53).
#[test]
fn generate_json_carries_the_numbers_of_its_lines() {
    let m = tiny();
    let args = [
        "generate",
        "-m",
        s(&m),
        "-p",
        "hi",
        "-n",
        "4",
        "--format",
        "json",
    ];
    let o = bmoe(&[&args[..], &["--moe-stream", "--cache-mb", "1"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["timing"]["n_decoded"].as_u64().unwrap() > 0, "{v}");
    assert!(v["stream"]["cache_misses"].as_u64().is_some(), "{v}");
    assert_eq!(v["load"]["mode"], "lean", "{v}");
    assert!(v["load"]["seconds"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["expert_cache_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peak_rss"]["mib"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["peak_rss"]["anon_mib"].as_f64().is_some(), "{v}");
    // Resident: no expert cache; decide and ppl carry the load too, and no peak.
    let o = bmoe(&args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["load"]["mode"], "llama", "{v}");
    assert!(v["expert_cache_bytes"].is_null(), "{v}");
    let text = m.with_file_name("json-text.txt");
    std::fs::write(&text, "one two three four five six seven eight").unwrap();
    let o = bmoe(&["ppl", "-m", s(&m), s(&text), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["ppl"].as_f64().is_some() && v["load"]["seconds"].is_number(),
        "{v}"
    );
    assert!(v.get("peak_rss").is_none(), "{v}");
}

#[test]
fn bad_inputs_are_clear_errors() {
    let m = tiny();
    let dir = m.parent().unwrap();
    let o = bmoe(&["generate", "-m", "/nonexistent/x.gguf", "-p", "hi"]);
    assert_clean_error(&o, "does not exist");

    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, "not a model at all").unwrap();
    assert_clean_error(
        &bmoe(&["generate", "-m", s(&junk), "-p", "hi"]),
        "is not a GGUF file",
    );

    let bytes = std::fs::read(&m).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    assert_clean_error(&bmoe(&["generate", "-m", s(&cut), "-p", "hi"]), "truncated");

    let long = "word ".repeat(400);
    assert_clean_error(
        &bmoe(&["generate", "-m", s(&m), "-c", "256", "-p", &long]),
        "the context holds 256",
    );
    assert_clean_error(
        &bmoe(&[
            "decide",
            "-m",
            s(&m),
            "--prefix",
            "x",
            "--choice",
            "Yes",
            "--choice",
            "Yellow",
        ]),
        "start with the same token",
    );
    assert_clean_error(
        // Refused by the argument parser, before a model (gigabytes) is loaded.
        &bmoe(&["decide", "-m", "/nonexistent.gguf", "--prefix", "x"]),
        "the following required arguments were not provided",
    );
}

#[test]
fn an_out_of_range_routed_share_is_an_error_not_a_panic() {
    let m = tiny();
    let o = bmoe(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "Hi",
        "-n",
        "4",
        "--prefill-device",
        "HTP0",
        "--allow-cpu-fallback",
        "--prefill-routed-full",
        "1.5",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("routed_full = 1.5") && err.contains("(0, 1]"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn synth_cli_writes_the_library_bytes() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("tiny.gguf");
    let o = bmoe(&["synth", "--preset", "tiny", "-o", s(&p)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&p).unwrap() == std::fs::read(tiny()).unwrap(),
        "`bmoe synth --preset tiny` and bmoe_synth::write_model wrote different files"
    );
}

#[test]
fn a_streaming_flag_without_streaming_says_it_does_nothing() {
    let m = tiny();
    let o = bmoe(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "Hi",
        "-n",
        "2",
        "--cache-mb",
        "20",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "bmoe: --cache-mb has no effect (moe_stream is false: nothing is streamed): ignored"
        ),
        "{err}"
    );
    let o = bmoe(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "Hi",
        "-n",
        "2",
        "--moe-stream",
        "--cache-mb",
        "1",
    ]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("has no effect"));
}
