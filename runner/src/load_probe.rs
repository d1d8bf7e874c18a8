//! The probe: a model loaded once in a child process (`bmoe __probe <model>`) before this process
//! loads it, so that what llama.cpp does not report as an error (an assert that aborts, a memory
//! fault) kills the child instead of the run. The child loads the model, tokenizes a word and
//! generates one token; the parent reads how it ended.
use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use bmoe_engine::{GenerateOptions, LoadOptions, Model, Sampling, SessionOptions};

/// Lines of the child's log quoted when it died.
const TAIL_LINES: usize = 6;

/// The first argument that makes `bmoe` the probe's child (`bmoe __probe MODEL`); internal, so
/// it is no clap command (no completion, help or man page shows it).
pub const CHILD_ARG: &str = "__probe";

/// How a probe ended.
#[derive(Debug)]
pub enum ProbeResult {
    /// The child loaded the model and generated a token.
    Ok {
        /// Seconds the child took, start to exit.
        seconds: f64,
    },
    /// The child refused the model with an error of its own (the same one a load here would give).
    Refused(String),
    /// The child died (a signal, or an exit code bmoe never uses): llama.cpp aborted; or it was
    /// killed for running past the load time limit.
    Aborted(String),
}

impl ProbeResult {
    /// The message for an error row and the `error:` line, `None` when the probe passed.
    pub fn error(&self) -> Option<&str> {
        match self {
            ProbeResult::Ok { .. } => None,
            ProbeResult::Refused(m) | ProbeResult::Aborted(m) => Some(m),
        }
    }
}

/// The last `n` non-empty lines of `text`, joined with " | ".
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join(" | ")
}

/// The command that runs this bmoe again: its executable, or, where it runs through a dynamic
/// loader named explicitly (dist/aarch64's launcher, docs/phones.md: /proc/self/exe is then the
/// loader), that loader with the launcher's library folder and program.
pub(crate) fn self_command() -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("finding the bmoe executable")?;
    let through_loader = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("ld-linux"));
    let Some(dir) = exe.parent().filter(|_| through_loader) else {
        return Ok(Command::new(exe));
    };
    let mut c = Command::new(&exe);
    c.arg("--library-path").arg(dir).arg(dir.join("bmoe"));
    Ok(c)
}

/// How often the parent looks whether the child has ended.
const POLL: Duration = Duration::from_millis(20);

/// Loads `model` once in a child process and reports how that went; a child still running after
/// `limit` is killed and the probe fails saying so.
pub fn probe(model: &Path, limit: Duration) -> anyhow::Result<ProbeResult> {
    let t0 = Instant::now();
    let mut cmd = self_command()?;
    // The child computes with the CPU variant this process chose and probed (modules.rs): no
    // second probe, no second `bmoe:` line about a variant skipped.
    if let Some(v) = bmoe_engine::backend_modules().and_then(|m| m.cpu_variant) {
        cmd.env("BMOE_CPU_VARIANT", v).env("BMOE_CPU_PROBE", "0");
    }
    let mut child = cmd
        .arg(CHILD_ARG)
        .arg(model)
        // ggml's abort would otherwise try to attach a debugger for a backtrace.
        .env("GGML_NO_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the probe process")?;
    // Drained on a thread so a chatty child never blocks on a full pipe while we wait; kept in
    // a shared buffer so a killed child's log can be quoted without waiting for the pipe to close.
    let log = Arc::new(Mutex::new(Vec::new()));
    let drained = child.stderr.take().map(|e| {
        let log = log.clone();
        std::thread::spawn(move || drain(e, &log))
    });
    let status = wait_within(child, limit).context("waiting for the probe process")?;
    let seconds = t0.elapsed().as_secs_f64();
    if status.is_some() {
        if let Some(h) = drained {
            let _ = h.join();
        }
    }
    let stderr =
        String::from_utf8_lossy(&log.lock().unwrap_or_else(PoisonError::into_inner)).into_owned();
    Ok(verdict(model, status, &stderr, limit, seconds))
}

/// Appends what `from` gives to `log` until it ends.
fn drain(mut from: impl Read, log: &Mutex<Vec<u8>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(&buf[..n]);
    }
}

/// The child's exit status, or `None` when it was still running after `limit` (then killed).
fn wait_within(
    mut child: std::process::Child,
    limit: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            child.kill()?;
            // A child inside a read of a hung FUSE or network mount dies of the SIGKILL only
            // when that read returns: a thread reaps it then, nothing here waits for it.
            std::thread::spawn(move || child.wait());
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// How the child ended, as the probe's result.
fn verdict(
    model: &Path,
    status: Option<ExitStatus>,
    stderr: &str,
    limit: Duration,
    seconds: f64,
) -> ProbeResult {
    let shown = bmoe_display(model);
    let log = tail(stderr, TAIL_LINES);
    let log = if log.is_empty() { "(no log)" } else { &log };
    let Some(status) = status else {
        return ProbeResult::Aborted(format!(
            "{shown}: the load did not finish within {} s (load_timeout_s); the probe's child was killed: {log}",
            limit.as_secs()
        ));
    };
    match status.code() {
        Some(0) => ProbeResult::Ok { seconds },
        // bmoe's own refusal: the child printed `error: <why>` last.
        Some(1) => {
            let why = stderr
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("error: "))
                .map(str::to_string)
                .unwrap_or_else(|| tail(stderr, TAIL_LINES));
            ProbeResult::Refused(why)
        }
        other => {
            let how = match other {
                Some(c) => format!("exit status {c}"),
                None => signal_name(&status),
            };
            ProbeResult::Aborted(format!(
                "{shown}: llama.cpp aborted while loading ({how}): {log}"
            ))
        }
    }
}

#[cfg(unix)]
fn signal_name(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match s.signal() {
        Some(6) => "SIGABRT".into(),
        Some(11) => "SIGSEGV".into(),
        Some(8) => "SIGFPE".into(),
        Some(7) => "SIGBUS".into(),
        Some(4) => "SIGILL".into(),
        Some(9) => "SIGKILL".into(),
        Some(n) => format!("signal {n}"),
        None => "no exit status".into(),
    }
}

#[cfg(not(unix))]
fn signal_name(_: &std::process::ExitStatus) -> String {
    "no exit status".into()
}

fn bmoe_display(p: &Path) -> String {
    crate::config::paths::display_path(p)
}

/// The child side (`bmoe __probe <model>`): load, tokenize, one greedy token; llama.cpp's log on
/// stderr so the parent can quote its last lines if this process dies.
pub fn run_child(model: &Path) -> anyhow::Result<()> {
    bmoe_engine::set_log_verbose(true);
    let m = Model::load(&LoadOptions {
        path: model.to_path_buf(),
        n_expert_used: None,
        stream: None,
        prefill: None,
        offload: None,
        repack: bmoe_engine::Repack::Auto,
        stock: false,
    })?;
    let mut s = m.session(&SessionOptions {
        threads: 1,
        n_ctx: 64,
        n_ubatch: 8,
        n_ubatch_device: 8,
        ..SessionOptions::default()
    })?;
    let opts = GenerateOptions {
        n_predict: 1,
        // Through the chat template too, when the model has one: it is part of what a job runs.
        chat: true,
        sampling: Sampling::Greedy,
    };
    s.generate("hi", &opts, &bmoe_engine::CancelToken::new())?;
    // Test hook (the probe's own tests; see docs/robustness.md): die the way llama.cpp's asserts
    // do, after the model loaded, so the parent's handling of an abort can be exercised without a
    // model that still crashes llama.cpp (every one found so far is refused before loading).
    let selftest = std::env::var_os("BMOE_PROBE_SELFTEST");
    if selftest.as_ref().is_some_and(|v| v == "abort") {
        eprintln!("bmoe probe self-test: aborting as llama.cpp's GGML_ASSERT would");
        std::process::abort();
    }
    // The same for a load that never ends (a loop in llama.cpp, a read that never returns).
    if selftest.is_some_and(|v| v == "hang") {
        eprintln!("bmoe probe self-test: hanging as a stuck load would");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_non_empty_lines() {
        assert_eq!(tail("a\n\nb\nc\n \nd\n", 2), "c | d");
        assert_eq!(tail("", 3), "");
    }
}
