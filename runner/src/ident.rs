//! What produced a row: the build (git commit, llama.cpp pin), the machine (host, CPU), the
//! process's peak memory, and content hashes of the profile and the model. The model hash reads
//! the whole file once and is cached by (path, size, mtime), since a model is gigabytes.
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

/// The git commit bmoe was built from (set by build.rs; `unknown` outside a git checkout).
pub const GIT_COMMIT: &str = env!("BMOE_GIT_COMMIT");

/// The llama.cpp build: the pinned llama-cpp-sys-2 version that vendors it (set by build.rs).
pub const LLAMA_CPP: &str = env!("BMOE_LLAMA_CPP");

/// `bmoe --version` in full: the commit, the llama.cpp pin, and the ggml backends and CPU
/// features of this build (`-V` prints the version alone), as `rustc -vV` does.
pub fn long_version() -> String {
    format!(
        "{}\ncommit: {GIT_COMMIT}\nllama.cpp: {LLAMA_CPP}\nbackends: {}\ncpu: {}\ncpu variant: {}\nmodules: {}",
        env!("CARGO_PKG_VERSION"),
        bmoe_engine::backend_names().join(", "),
        bmoe_engine::system_info().trim(),
        bmoe_engine::cpu_variant().line(),
        modules_line()
    )
}

/// Where ggml's backend modules came from, which were loaded, and the CPU variants skipped (with
/// why) or missing; for `bmoe devices` and `bmoe --version`.
pub fn modules_line() -> String {
    let Some(m) = bmoe_engine::backend_modules() else {
        return if cfg!(feature = "cpu-variants") {
            "ggml's own choice: ggml_backend_load_all scored the libggml-cpu-*.so next to the \
             executable (the ARM64 bundle)"
                .into()
        } else {
            "none: the backends are linked in (a build without the cpu-variants feature)".into()
        };
    };
    let Some(dir) = &m.dir else {
        return format!(
            "MISSING: no libggml-cpu*.so in {} (BMOE_BACKEND_DIR names another folder)",
            m.searched.join(", ")
        );
    };
    let mut s = format!("{} from {dir}", m.loaded.join(" "));
    if !m.skipped.is_empty() {
        s += &format!("; skipped: {}", m.skipped.join("; "));
    }
    if !m.missing.is_empty() {
        s += &format!("; missing: {}", m.missing.join(" "));
    }
    if let Some(f) = &m.probe_memo {
        s += &format!("; probe verdicts remembered in {f}");
    }
    s
}

/// The default run id: `<name>-<UTC time to the millisecond>` (`demo-20261203T192928.123Z`), so
/// two runs started in one second differ; for a sharded run `<name>-<UTC date>`, so every shard
/// started the same day derives the same id without being told.
pub fn default_run_id(name: &str, sharded: bool, now: chrono::DateTime<chrono::Utc>) -> String {
    let ts = if sharded {
        now.format("%Y%m%d").to_string()
    } else {
        now.format("%Y%m%dT%H%M%S%.3fZ").to_string()
    };
    format!("{name}-{ts}")
}

/// The machine a run is on, read once.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// Host name.
    pub host: String,
    /// CPU model, empty when /proc/cpuinfo does not say.
    pub cpu_model: String,
    /// CPUs this process may use.
    pub cpu_cores: Option<u32>,
    /// The CPU kernels in use (`bmoe_engine::CpuVariant::line`).
    pub cpu_variant: String,
    /// `move` or `release`: the page-move self-check's verdict.
    pub page_moves: String,
}

impl Machine {
    /// Reads the host name and CPU description.
    pub fn detect() -> Self {
        Self {
            host: host_name(),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .map(|t| cpu_model(&t))
                .unwrap_or_default(),
            cpu_cores: std::thread::available_parallelism()
                .ok()
                .and_then(|n| u32::try_from(n.get()).ok()),
            cpu_variant: bmoe_engine::cpu_variant().line(),
            page_moves: page_moves_verdict(),
        }
    }
}

/// The page-move self-check's label, with a `bmoe:` line when it fell back.
pub fn page_moves_verdict() -> String {
    let v = bmoe_engine::page_moves();
    if let bmoe_engine::PageMoves::Release(why) = v {
        eprintln!("bmoe: page moves: {why}; the expert cache releases evicted pages instead");
    }
    v.label().to_string()
}

fn host_name() -> String {
    // The kernel's own name for the host: present on Linux and Android without a libc call.
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

/// The CPU model in a /proc/cpuinfo text: x86's `model name`, else ARM's `Hardware` or
/// `Processor` line (Android kernels put the SoC there).
pub fn cpu_model(cpuinfo: &str) -> String {
    for key in ["model name", "Hardware", "Processor", "cpu model"] {
        let hit = cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key && !v.trim().is_empty()).then(|| v.trim().to_string())
        });
        if let Some(v) = hit {
            // A comma would need quoting in every tool downstream; keep the cell plain.
            return v.replace(',', " ");
        }
    }
    String::new()
}

/// The process's peak resident set (`VmHWM`), in MiB; `None` where /proc does not say.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb as f64 / 1024.0)
}

/// Resets the process's peak resident set (`VmHWM`) to its current resident set, so the next
/// [`peak_rss_mib`] is the peak since now (Linux 4.0+: `5` to `/proc/self/clear_refs`); false
/// where the kernel does not allow it (the peak then stays the process's).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The highest anonymous and file-backed resident memory seen while it lives, sampled every
/// 10 ms on a thread of its own (the kernel keeps a peak only for the total, `VmHWM`).
pub struct RssPeaks {
    peaks: std::sync::Arc<[std::sync::atomic::AtomicU64; 2]>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl RssPeaks {
    /// Starts sampling.
    pub fn start() -> RssPeaks {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let peaks = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let stop = Arc::new(AtomicBool::new(false));
        let sample = {
            let peaks = peaks.clone();
            move || {
                if let Some((anon, file)) = bmoe_engine::rss_split() {
                    peaks[0].fetch_max(anon, Ordering::Relaxed);
                    peaks[1].fetch_max(file, Ordering::Relaxed);
                }
            }
        };
        sample();
        let (p, st) = (sample, stop.clone());
        // Without the thread the peaks are only sampled when read; still right, only coarser.
        let sampler = std::thread::Builder::new()
            .name("bmoe-rss".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    p();
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })
            .ok();
        RssPeaks {
            peaks,
            stop,
            sampler,
        }
    }

    /// Starts the peaks again from the memory resident now.
    pub fn reset(&self) {
        use std::sync::atomic::Ordering;
        let (anon, file) = bmoe_engine::rss_split().unwrap_or((0, 0));
        self.peaks[0].store(anon, Ordering::Relaxed);
        self.peaks[1].store(file, Ordering::Relaxed);
    }

    /// The peaks so far, in MiB (anonymous, file-backed); `None` where /proc does not say.
    pub fn peaks_mib(&self) -> (Option<f64>, Option<f64>) {
        use std::sync::atomic::Ordering;
        let Some((anon, file)) = bmoe_engine::rss_split() else {
            return (None, None);
        };
        let a = self.peaks[0].fetch_max(anon, Ordering::Relaxed).max(anon);
        let f = self.peaks[1].fetch_max(file, Ordering::Relaxed).max(file);
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        (Some(mib(a)), Some(mib(f)))
    }
}

impl Drop for RssPeaks {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.sampler.take() {
            let _ = h.join();
        }
    }
}

/// SHA-256 of a small file's bytes (a profile), first 16 hex digits.
pub fn file_hash16(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex(&Sha256::digest(&bytes))[..16].to_string())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The files of a model: the file itself, or every shard of a split GGUF
/// (`name-00001-of-00003.gguf`) in order when the path names the first one and all exist.
pub fn model_files(path: &Path) -> Vec<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let split = name
        .strip_suffix(".gguf")
        .and_then(|s| s.rsplit_once("-of-"))
        .and_then(|(head, count)| {
            let (stem, idx) = head.rsplit_once('-')?;
            let n: u32 = count.parse().ok()?;
            (idx.len() == 5 && count.len() == 5 && idx.parse::<u32>().ok()? == 1 && n > 1)
                .then(|| (stem.to_string(), n))
        });
    if let Some((stem, n)) = split {
        let files: Vec<PathBuf> = (1..=n)
            .map(|i| path.with_file_name(format!("{stem}-{i:05}-of-{n:05}.gguf")))
            .collect();
        if files.iter().all(|f| f.exists()) {
            return files;
        }
    }
    vec![path.to_path_buf()]
}

/// Where the model-hash cache lives: `$XDG_CACHE_HOME/bmoe`, else `~/.cache/bmoe`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("bmoe"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/bmoe"))
}

/// One cache line's key: absolute path, size and mtime (ns) of every file of the model.
fn cache_key(files: &[PathBuf]) -> anyhow::Result<String> {
    let mut parts = Vec::new();
    for f in files {
        let meta = std::fs::metadata(f).with_context(|| format!("reading {}", f.display()))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let abs = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
        // Tabs separate fields; a path holding one (or a newline) is simply never cached.
        parts.push(format!("{}|{}|{mtime}", abs.display(), meta.len()));
    }
    Ok(parts.join(";"))
}

const CACHE_FILE: &str = "model-sha256.tsv";

fn cache_lookup(dir: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(CACHE_FILE)).ok()?;
    text.lines().rev().find_map(|l| {
        let (k, v) = l.split_once('\t')?;
        (k == key && v.len() == 64).then(|| v.to_string())
    })
}

fn cache_store(dir: &Path, key: &str, sha: &str) -> anyhow::Result<()> {
    if key.contains(['\t', '\n', '\r']) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join(CACHE_FILE);
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    // Keep the other entries (the newest per key), drop this key's stale ones.
    let mut out: Vec<String> = old
        .lines()
        .filter(|l| l.split_once('\t').map(|(k, _)| k != key).unwrap_or(false))
        .map(str::to_string)
        .collect();
    out.push(format!("{key}\t{sha}"));
    // Written to a temporary file and renamed, so shards sharing a cache never see half a file.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all((out.join("\n") + "\n").as_bytes())?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// SHA-256 of the whole model (every shard, in order), 64 hex digits: from the cache when the
/// files' paths, sizes and mtimes match, else read once (with a progress bar on a terminal) and
/// stored. A cache that cannot be written costs a warning, not the run.
pub fn model_sha256(path: &Path, quiet: bool) -> anyhow::Result<String> {
    let files = model_files(path);
    let key = cache_key(&files)?;
    let dir = cache_dir();
    if let Some(hit) = dir.as_deref().and_then(|d| cache_lookup(d, &key)) {
        return Ok(hit);
    }
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let bar = if !quiet && std::io::stderr().is_terminal() {
        let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{bar:20}] {bytes}/{total_bytes} {msg} ({bytes_per_sec}, ETA {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_prefix("sha256");
        b.set_message(crate::config::paths::display_path(path));
        b
    } else {
        if !quiet && total >= 1 << 30 {
            eprintln!(
                "bmoe: hashing {} ({:.1} GiB) once; the result is cached",
                crate::config::paths::display_path(path),
                total as f64 / f64::from(1u32 << 30)
            );
        }
        ProgressBar::hidden()
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    for f in &files {
        let mut file =
            std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?;
        loop {
            let n = file
                .read(&mut buf)
                .with_context(|| format!("reading {}", f.display()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            bar.inc(n as u64);
        }
    }
    bar.finish_and_clear();
    let sha = hex(&h.finalize());
    if let Some(d) = dir {
        if let Err(e) = cache_store(&d, &key, &sha) {
            eprintln!(
                "bmoe: cannot cache the model hash in {} ({e:#}); it will be computed again next run",
                d.display()
            );
        }
    }
    Ok(sha)
}

/// The caller's part of a prefix-cache key: the model's content, this build and its llama.cpp
/// pin, and every layered setting but those that only say where and how much to keep (the
/// engine adds the CPU kernels and the piece widths). Conservative: a setting that cannot change
/// a number still separates entries, which costs a restore, never a wrong score.
pub fn prefix_key(model_sha256: &str, settings: &crate::config::settings::Settings) -> String {
    let mut s = serde_json::to_value(settings).unwrap_or_default();
    if let Some(m) = s.as_object_mut() {
        for k in [
            "prefix_cache",
            "prefix_cache_mb",
            "explain",
            "load_timeout_s",
        ] {
            m.remove(k);
        }
    }
    format!(
        "model {model_sha256}\nbmoe {} {GIT_COMMIT}\nllama.cpp {LLAMA_CPP}\nsettings {s}",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_key_separates_what_changes_numbers_not_where_entries_go() {
        use crate::config::settings::Settings;
        let base = Settings::default();
        let key = |s: &Settings| super::prefix_key("abc", s);
        let other_model = super::prefix_key("abd", &base);
        assert_ne!(key(&base), other_model);
        let topk = Settings {
            n_expert_used: 1,
            ..base.clone()
        };
        assert_ne!(key(&base), key(&topk));
        let elsewhere = Settings {
            prefix_cache: "other".into(),
            prefix_cache_mb: 9,
            ..base.clone()
        };
        assert_eq!(key(&base), key(&elsewhere));
    }

    use super::*;

    #[test]
    fn default_run_ids_differ_within_a_second_and_agree_across_shards_of_a_day() {
        use chrono::TimeZone;
        let t0 = chrono::Utc
            .with_ymd_and_hms(2026, 12, 3, 19, 29, 28)
            .unwrap();
        let t1 = t0 + chrono::Duration::milliseconds(1);
        assert_eq!(
            default_run_id("demo", false, t0),
            "demo-20261203T192928.000Z"
        );
        assert_ne!(
            default_run_id("demo", false, t0),
            default_run_id("demo", false, t1)
        );
        let later = t0 + chrono::Duration::hours(3);
        assert_eq!(default_run_id("demo", true, t0), "demo-20261203");
        assert_eq!(default_run_id("demo", true, later), "demo-20261203");
    }

    #[test]
    fn cpu_models() {
        assert_eq!(
            cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13, 64-Core\n"),
            "AMD EPYC 7B13  64-Core"
        );
        assert_eq!(
            cpu_model("processor\t: 0\nCPU part\t: 0xd44\nHardware\t: Qualcomm SM8650\n"),
            "Qualcomm SM8650"
        );
        assert_eq!(cpu_model(""), "");
    }

    #[test]
    fn split_models_hash_every_shard() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("m-00001-of-00002.gguf");
        let b = d.path().join("m-00002-of-00002.gguf");
        std::fs::write(&a, b"ab").unwrap();
        assert_eq!(
            model_files(&a),
            vec![a.clone()],
            "a missing shard: just the file"
        );
        std::fs::write(&b, b"c").unwrap();
        assert_eq!(model_files(&a), vec![a.clone(), b.clone()]);
        let one = d.path().join("x.gguf");
        std::fs::write(&one, b"abc").unwrap();
        assert_eq!(model_files(&one), vec![one.clone()]);
        std::env::set_var("XDG_CACHE_HOME", d.path().join("cache"));
        let whole = model_sha256(&one, true).unwrap();
        assert_eq!(
            whole,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(model_sha256(&a, true).unwrap(), whole, "ab + c = abc");
        // Cached: the entry is found without reading (and survives a rewrite with other content
        // only if size and mtime also match, which a rewrite changes).
        let cached = std::fs::read_to_string(d.path().join("cache/bmoe").join(CACHE_FILE)).unwrap();
        assert_eq!(cached.lines().count(), 2, "{cached}");
        assert_eq!(model_sha256(&one, true).unwrap(), whole);
    }
}
