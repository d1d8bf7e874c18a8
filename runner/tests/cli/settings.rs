//! Every setting either works or is refused: the settings a person types by mistake (a tiny
//! context, a phone's thread count on a 2-core machine, an out-of-range top-p) end in a result or
//! a clear error naming the setting, never a signal, a panic or a hang. Runs the real binary.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common;

/// What one run of the binary ended in.
struct Ran {
    code: Option<i32>,
    out: String,
    err: String,
    secs: f64,
}

/// Runs `bmoe args`, optionally pinned to `cpus` with taskset; kills it after `limit`.
fn run_limited(cpus: Option<&str>, args: &[&str], limit: Duration) -> Ran {
    let mut c = match cpus {
        Some(list) => {
            let mut c = Command::new("taskset");
            c.args(["-c", list, env!("CARGO_BIN_EXE_bmoe")]);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_bmoe")),
    };
    common::clean_env(&mut c)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = c.spawn().expect("spawn bmoe");
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = out_t.join().unwrap_or_default();
    let err = err_t.join().unwrap_or_default();
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        status.is_some(),
        "bmoe {args:?} did not finish within {limit:?}\nstderr: {err}"
    );
    let status = status.unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal().is_none(),
        "bmoe {args:?} died of signal {:?}\nstderr: {err}",
        status.signal()
    );
    Ran {
        code: status.code(),
        out,
        err,
        secs,
    }
}

/// Runs with one compute thread: several of these tests run at once, and ggml's threads spin at
/// barriers, so two-thread runs side by side on a 2-core machine crawl.
fn run(args: &[&str]) -> Ran {
    let mut a = args.to_vec();
    if ["generate", "decide", "ppl"].contains(&a[0]) {
        a.extend(["-t", "1"]);
    }
    run_limited(None, &a, Duration::from_secs(60))
}

fn tiny() -> PathBuf {
    common::model_path()
}

/// A text for `ppl`, in this test's own folder.
fn text_file() -> PathBuf {
    let p = common::shared_dir().join("text.txt");
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        std::fs::write(
            &p,
            "The quick brown fox jumps over the lazy dog. ".repeat(12),
        )
        .unwrap();
    });
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// No panic text, no backtrace, whatever the exit.
fn assert_no_panic(r: &Ran, what: &str) {
    for bad in ["panicked", "stack backtrace", "RUST_BACKTRACE"] {
        assert!(!r.err.contains(bad), "{what}: {bad} in {}", r.err);
    }
}

/// A clean refusal: non-zero exit, an `error:` line that contains `needle`.
fn assert_refused(r: &Ran, needle: &str, what: &str) {
    assert_no_panic(r, what);
    assert_ne!(r.code, Some(0), "{what}: expected a refusal\n{}", r.err);
    assert!(r.err.contains("error"), "{what}: {}", r.err);
    assert!(
        r.err.contains(needle),
        "{what}: expected {needle:?} in {}",
        r.err
    );
}

fn assert_ok(r: &Ran, what: &str) {
    assert_no_panic(r, what);
    assert_eq!(r.code, Some(0), "{what}: {}", r.err);
}

const PROMPT_40: &str = "Write a short note about the sea and sky.";

#[test]
fn context_of_one_is_a_clear_error_not_an_abort() {
    let m = tiny();
    let r = run(&["generate", "-m", s(&m), "-p", "hi", "-n", "3", "-c", "1"]);
    assert_refused(&r, "the context holds 1", "generate -c 1");
}

#[test]
fn decide_longer_than_the_context_is_refused() {
    let m = tiny();
    let r = run(&[
        "decide",
        "-m",
        s(&m),
        "--prefix",
        "You are an agent on a phone. Pick the button that saves the form.\n",
        "--suffix",
        "Screen: Save, Cancel, Help",
        "--choice",
        "Save",
        "--choice",
        "Cancel",
        "-c",
        "8",
    ]);
    assert_refused(&r, "the context holds 8", "decide -c 8");
}

#[test]
fn perplexity_with_a_small_context_gives_a_result() {
    let m = tiny();
    let r = run(&["ppl", "-m", s(&m), s(&text_file()), "-c", "8"]);
    assert_ok(&r, "ppl -c 8");
    assert!(r.out.contains("perplexity:"), "{}", r.out);
}

#[test]
fn generation_that_fills_the_context_stops_with_context_full() {
    let m = tiny();
    // With the chat template the tiny model's byte-level vocabulary makes this prompt 108 tokens.
    let r = run(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        PROMPT_40,
        "-n",
        "100",
        "-c",
        "64",
    ]);
    assert_refused(&r, "the context holds 64", "generate -c 64, templated");
    let r = run(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        PROMPT_40,
        "-n",
        "100",
        "-c",
        "64",
        "--json",
        "--raw",
    ]);
    assert_ok(&r, "generate -c 64 -n 100 --raw");
    let rec: serde_json::Value = serde_json::from_str(r.out.trim()).expect("json record");
    assert_eq!(rec["stopped"], "context_full", "{}", r.out);
    let n_prompt = rec["timing"]["n_prompt"].as_u64().unwrap();
    let n = rec["tokens"].as_array().unwrap().len() as u64;
    // Every cell of the context was used: the prompt's, then one per decoded token, plus the
    // last sampled token that had no cell left.
    assert_eq!(n_prompt + n, 65, "{}", r.out);
    assert!(r.err.contains("stopped: context full"), "{}", r.err);
}

#[test]
fn thread_counts_above_the_cores_are_capped_and_finish() {
    let m = tiny();
    // One core, so the cap is the same on any machine that runs this.
    for t in ["4", "8", "64", "1000"] {
        let r = run_limited(
            Some("0"),
            &["generate", "-m", s(&m), "-p", "hi", "-n", "3", "-t", t],
            Duration::from_secs(30),
        );
        assert_ok(&r, &format!("-t {t}"));
        assert!(
            r.err
                .contains(&format!("threads = {t} is more than the 1 cores")),
            "-t {t}: {}",
            r.err
        );
    }
    let r = run_limited(
        Some("0"),
        &["generate", "-m", s(&m), "-p", "hi", "-n", "3", "-t", "auto"],
        Duration::from_secs(30),
    );
    assert_ok(&r, "-t auto");
    assert!(!r.err.contains("more than"), "{}", r.err);
}

#[test]
fn out_of_range_sampling_is_refused() {
    let m = tiny();
    let r = run(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "hi",
        "-n",
        "3",
        "--seed",
        "1",
        "--top-p",
        "2",
    ]);
    assert_refused(&r, "top_p = 2 is out of range", "--top-p 2");
    let r = run(&[
        "generate",
        "-m",
        s(&m),
        "-p",
        "hi",
        "-n",
        "3",
        "--seed",
        "1",
        "--temp=-1",
    ]);
    assert_refused(&r, "temperature", "--temp -1");
}

/// A seeded xorshift: the draws are the same on every machine and every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[(self.next() % v.len() as u64) as usize]
    }
}

/// Words an error must contain one of: the setting it names, or the length it refused.
const NAMED: &[&str] = &[
    "context",
    "ctx",
    "threads",
    "ubatch",
    "min_tokens",
    "min-tokens",
    "io_threads",
    "io-threads",
    "loaders",
    "cache",
    "n_predict",
    "n-predict",
    "top_p",
    "top-p",
    "top_k",
    "top-k",
    "temperature",
    "temp",
    "routed_full",
    "routed-full",
    "n_expert_used",
    "n-expert-used",
];

#[test]
fn random_settings_end_in_a_result_or_a_named_error() {
    let m = tiny();
    let txt = text_file();
    let ctx = [
        "0", "1", "2", "7", "8", "16", "31", "32", "33", "64", "255", "256", "257", "512",
        "1048577", "-1", "x",
    ];
    let ubatch = [
        "0",
        "1",
        "2",
        "3",
        "8",
        "32",
        "64",
        "512",
        "8192",
        "8193",
        "99999999999",
    ];
    let threads = ["0", "1", "2", "3", "8", "1024", "1025", "auto", "-2"];
    let n_predict = ["0", "1", "2", "16", "300", "1048577"];
    let top_p = ["0", "0.01", "0.5", "1", "1.0001", "-1", "nan", "inf"];
    let temp = ["0", "0.7", "100", "100.5", "-0.1", "nan"];
    let top_k = ["0", "1", "40", "-1", "1048577"];
    let io = ["0", "1", "4", "64", "65", "auto"];
    let cache = ["0", "1", "4", "auto", "-1"];
    let mut rng = Rng(0x5eed_b0e5);
    let t0 = Instant::now();
    let mut seen = [0usize; 2];
    for i in 0..45 {
        let kind = ["generate", "decide", "ppl"][i % 3];
        let m_s = s(&m).to_string();
        let mut args: Vec<String> = vec![kind.into(), "-m".into(), m_s];
        // `--flag=value`, so a value such as -1 reaches the flag's parser instead of reading as a flag.
        let push = |a: &mut Vec<String>, k: &str, v: &str| a.push(format!("{k}={v}"));
        push(&mut args, "--ctx", rng.pick(&ctx));
        push(&mut args, "--ubatch", rng.pick(&ubatch));
        push(&mut args, "--threads", rng.pick(&threads));
        if rng.next().is_multiple_of(2) {
            args.push("--moe-stream".into());
            push(&mut args, "--io-threads", rng.pick(&io));
            push(&mut args, "--cache-mb", rng.pick(&cache));
        }
        match kind {
            "generate" => {
                push(&mut args, "--prompt", rng.pick(&["hi", PROMPT_40, "x"]));
                push(&mut args, "--n-predict", rng.pick(&n_predict));
                if rng.next().is_multiple_of(2) {
                    push(&mut args, "--seed", "7");
                    push(&mut args, "--top-p", rng.pick(&top_p));
                    push(&mut args, "--temp", rng.pick(&temp));
                    push(&mut args, "--top-k", rng.pick(&top_k));
                }
            }
            "decide" => {
                push(&mut args, "--prefix", "Pick one.\n");
                push(&mut args, "--suffix", rng.pick(&["A or B", PROMPT_40]));
                push(&mut args, "--choice", "A");
                push(&mut args, "--choice", "B");
            }
            _ => args.push(s(&txt).into()),
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        // Pinned to one core, so every drawn thread count is capped to 1 (the same on any machine).
        let r = run_limited(Some("0"), &argv, Duration::from_secs(30));
        let what = format!("#{i}: bmoe {}", argv.join(" "));
        assert_no_panic(&r, &what);
        if r.code == Some(0) {
            seen[0] += 1;
        } else {
            seen[1] += 1;
            assert!(r.err.contains("error"), "{what}: {}", r.err);
            assert!(
                NAMED.iter().any(|n| r.err.contains(n)),
                "{what}: the error names no setting: {}",
                r.err
            );
        }
        assert!(r.secs < 30.0, "{what}: {:.1} s", r.secs);
    }
    // Both outcomes occur, so the draws really probe the edges.
    assert!(seen[0] > 0 && seen[1] > 0, "results/errors: {seen:?}");
    eprintln!(
        "{} results, {} clear errors in {:.1} s",
        seen[0],
        seen[1],
        t0.elapsed().as_secs_f64()
    );
}
