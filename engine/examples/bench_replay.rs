//! A nightly agent replay, side by side in one run: decisions per second with prefix reuse off,
//! auto and on, `first_token` against `sum` scoring, resident or streamed. Run through
//! `scripts/bench-replay`.
//!
//! `bench_replay MODEL [THREADS] [N] [resident|stream|stream:MiB] [UBATCH] [all|first_token]`
//! (`stream`: a 256 MiB expert cache, `stream:MiB` another size; `first_token`: the `sum` rows are
//! left out)
//!
//! `bench_replay MODEL THREADS N MODE UBATCH paired [FIRST-LAST] [LOG]`: `off` and `auto`
//! (`first_token`) episode by episode, in turn (the first of the two alternating), each episode's
//! result appended to LOG, and the table summed over every episode LOG holds for this
//! configuration. A long replay can so run in parts (episodes FIRST to LAST, counted from 0), in
//! different processes or days, and noise on a shared CPU falls on both modes alike. `summary` in
//! place of FIRST-LAST runs nothing and prints the table of what LOG holds.
//!
//! The trace: episodes of 25 steps (one agent task each); each episode starts a new task with a ~1,500-token prefix
//! (instructions, task), every step adds ~60 tokens of history, and each decision ends with a
//! ~40-token screen and 4 choices (two of them sharing a first token, for `sum`).
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use bmoe_engine::{
    DecideRecord, DecideRequest, LoadOptions, Model, PrefixReuse, Scoring, SessionOptions,
    StreamOptions,
};

/// `n` characters of text built from `seed` (the synthetic vocabulary is byte-level: about three
/// quarters of n characters make n tokens, a space being 3 bytes).
fn text(n: usize, seed: &str) -> String {
    seed.chars().cycle().take(n * 3 / 4).collect()
}

/// Decisions per episode (one agent task).
const EPISODE: usize = 25;

fn trace(n: usize) -> Vec<DecideRequest> {
    (0..n)
        .map(|i| {
            let episode = i / EPISODE;
            let step = i % EPISODE;
            let mut prefix = text(
                1500,
                &format!("Episode {episode}: you are an agent on a phone; follow the task. "),
            );
            for s in 0..step {
                prefix.push_str(&text(
                    60,
                    &format!("Step {s}: tapped button {}. ", s * 7 % 13),
                ));
            }
            DecideRequest {
                prefix,
                suffix: text(40, &format!("Screen {step}: Save Cancel Back. ")),
                choices: vec![
                    "click(save)".into(),
                    "back".into(),
                    "scroll".into(),
                    "type(hello)".into(),
                ],
                scoring: Scoring::FirstToken,
                raw: true,
            }
        })
        .collect()
}

fn run(
    m: &Model,
    reqs: &[DecideRequest],
    opts: &SessionOptions,
    scoring: Scoring,
) -> (f64, Vec<DecideRecord>) {
    let mut s = m.session(opts).expect("session");
    let t0 = Instant::now();
    let out: Vec<DecideRecord> = reqs
        .iter()
        .map(|r| {
            s.decide(&DecideRequest {
                scoring,
                ..r.clone()
            })
            .expect("decide")
        })
        .collect();
    (t0.elapsed().as_secs_f64(), out)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let model = arg(0).unwrap_or("models/small.gguf").to_string();
    let threads: u32 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let n: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    // `stream` keeps the 256 MiB cache earlier runs used; `stream:MiB` sets it.
    let mode = arg(3).unwrap_or("resident");
    let cache_mib: Option<u64> = match mode {
        "resident" => None,
        "stream" => Some(256),
        m => Some(
            m.strip_prefix("stream:")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("expected resident, stream or stream:MiB, got {m:?}")),
        ),
    };
    let ubatch: u32 = arg(4).and_then(|s| s.parse().ok()).unwrap_or(512);
    let with_sum = !matches!(arg(5), Some("first_token" | "paired"));
    let key = format!("{model} {mode} t{threads} u{ubatch} n{n}");
    // `paired summary LOG`: the table of what the log holds; no model is loaded.
    if arg(5) == Some("paired") && arg(6) == Some("summary") {
        let path = arg(7).expect("paired summary: LOG missing");
        summarize(
            &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")),
            &key,
        );
        return;
    }
    let m = Model::load(&LoadOptions {
        stream: cache_mib.map(|mib| StreamOptions {
            cache: bmoe_engine::CacheBudget::Mib(mib),
            io_threads: 4,
            ..Default::default()
        }),
        ..LoadOptions::new(&model)
    })
    .expect("load");
    let reqs = trace(n);
    let opts = |reuse| SessionOptions {
        threads,
        n_ctx: 4096,
        n_ubatch: ubatch,
        prefix_reuse: reuse,
        ..Default::default()
    };
    println!(
        "# bench_replay {model} ({}), {n} decisions, {threads} threads, ubatch {ubatch}, {}",
        m.info().arch,
        match cache_mib {
            Some(mib) => format!("streamed (cache {mib} MiB)"),
            None => "resident".into(),
        }
    );
    if arg(5) == Some("paired") {
        let episodes = parse_range(arg(6), n.div_ceil(EPISODE));
        paired(&m, &reqs, &opts, episodes, &key, arg(7));
        return;
    }
    println!("| configuration | s | decisions/s | prompt tokens prefilled | vs reuse off | same best as off (same scoring) | scores bit for bit = off |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (t_off, off) = run(&m, &reqs, &opts(PrefixReuse::Off), Scoring::FirstToken);
    let rows = [
        (
            "first_token, reuse off",
            PrefixReuse::Off,
            Scoring::FirstToken,
        ),
        (
            "first_token, reuse auto",
            PrefixReuse::Auto,
            Scoring::FirstToken,
        ),
        (
            "first_token, reuse on",
            PrefixReuse::On,
            Scoring::FirstToken,
        ),
        ("sum, reuse off", PrefixReuse::Off, Scoring::Sum),
        ("sum, reuse on", PrefixReuse::On, Scoring::Sum),
    ];
    let mut on_first = 0.0;
    let mut sum_off: Vec<DecideRecord> = Vec::new();
    for (name, reuse, scoring) in rows {
        if scoring == Scoring::Sum && !with_sum {
            continue;
        }
        let (t, recs) = if reuse == PrefixReuse::Off && scoring == Scoring::FirstToken {
            (t_off, off.clone())
        } else {
            run(&m, &reqs, &opts(reuse), scoring)
        };
        if reuse == PrefixReuse::On && scoring == Scoring::FirstToken {
            on_first = t;
        }
        // `sum` rows are compared with `sum, reuse off` (the first of them, with itself).
        if scoring == Scoring::Sum && sum_off.is_empty() {
            sum_off = recs.clone();
        }
        let base = if scoring == Scoring::FirstToken {
            &off
        } else {
            &sum_off
        };
        let c = compare(t, &recs, base);
        let same = format!("{}/{n} | {}/{n}", c.same_best, c.same_bits);
        println!(
            "| {name} | {t:.2} | {:.2} | {} | {:.2}x | {same} |",
            n as f64 / t,
            c.prefilled,
            t_off / t
        );
        if scoring == Scoring::Sum {
            let (what, first) = if reuse == PrefixReuse::On {
                ("on", on_first)
            } else {
                ("off", t_off)
            };
            println!(
                "| sum / first_token cost, reuse {what} | | | | {:.2}x | | |",
                t / first
            );
        }
    }
    if !with_sum {
        return;
    }
    // The same two reuse-on configurations once more, decision by decision in turn (alternating
    // which goes first), so that a CPU shared with other work slows both alike.
    let (tf, ts) = interleaved(&m, &reqs, &opts(PrefixReuse::On));
    println!(
        "| sum / first_token cost, reuse on, interleaved ({tf:.2} s / {ts:.2} s) | | | | {:.2}x | | |",
        ts / tf
    );
}

/// Seconds spent by `first_token` and by `sum` on `reqs`, each in its own session, one decision
/// of each in turn.
fn interleaved(m: &Model, reqs: &[DecideRequest], opts: &SessionOptions) -> (f64, f64) {
    let mut first = m.session(opts).expect("session");
    let mut sum = m.session(opts).expect("session");
    let (mut tf, mut ts) = (0.0, 0.0);
    for (i, r) in reqs.iter().enumerate() {
        for k in 0..2 {
            let scoring = if (i + k) % 2 == 0 {
                Scoring::FirstToken
            } else {
                Scoring::Sum
            };
            let s = if scoring == Scoring::Sum {
                &mut sum
            } else {
                &mut first
            };
            let t0 = Instant::now();
            s.decide(&DecideRequest {
                scoring,
                ..r.clone()
            })
            .expect("decide");
            let t = t0.elapsed().as_secs_f64();
            if scoring == Scoring::Sum {
                ts += t;
            } else {
                tf += t;
            }
        }
    }
    (tf, ts)
}

/// Episodes `FIRST-LAST` (inclusive, from 0), or all `count` of them.
fn parse_range(arg: Option<&str>, count: usize) -> std::ops::Range<usize> {
    let Some(a) = arg else { return 0..count };
    let (first, last) = a.split_once('-').unwrap_or((a, a));
    let num = |s: &str| -> usize {
        s.parse()
            .unwrap_or_else(|_| panic!("episodes: expected FIRST-LAST, got {a:?}"))
    };
    let (first, last) = (num(first), num(last));
    assert!(
        first <= last && last < count,
        "episodes {a}: the trace has episodes 0-{}",
        count - 1
    );
    first..last + 1
}

/// One episode of one mode: seconds, tokens prefilled, and the decisions whose best choice and
/// whose every score's bits equal `off`'s.
struct EpisodeResult {
    seconds: f64,
    prefilled: u64,
    same_best: usize,
    same_bits: usize,
    decisions: usize,
}

fn compare(t: f64, recs: &[DecideRecord], off: &[DecideRecord]) -> EpisodeResult {
    let bits =
        |r: &DecideRecord| -> Vec<u64> { r.choice_logp.iter().map(|v| v.to_bits()).collect() };
    EpisodeResult {
        seconds: t,
        prefilled: recs.iter().map(|r| u64::from(r.n_prefilled)).sum(),
        same_best: recs
            .iter()
            .zip(off)
            .filter(|(a, b)| a.best == b.best)
            .count(),
        same_bits: recs
            .iter()
            .zip(off)
            .filter(|(a, b)| bits(a) == bits(b))
            .count(),
        decisions: recs.len(),
    }
}

/// Runs `off` and `auto` on each episode in turn, appends each result to `log`, then prints the
/// sums over every episode the log holds under `key`.
fn paired(
    m: &Model,
    reqs: &[DecideRequest],
    opts: &dyn Fn(PrefixReuse) -> SessionOptions,
    episodes: std::ops::Range<usize>,
    key: &str,
    log: Option<&str>,
) {
    let mut lines = Vec::new();
    for e in episodes {
        let ep = &reqs[e * EPISODE..((e + 1) * EPISODE).min(reqs.len())];
        let run_mode = |r| run(m, ep, &opts(r), Scoring::FirstToken);
        // Alternate which mode runs first, so a slow stretch of the machine is shared.
        let ((t_off, off), (t_auto, auto)) = if e % 2 == 0 {
            let o = run_mode(PrefixReuse::Off);
            (o, run_mode(PrefixReuse::Auto))
        } else {
            let a = run_mode(PrefixReuse::Auto);
            (run_mode(PrefixReuse::Off), a)
        };
        for (mode, r) in [
            ("off", compare(t_off, &off, &off)),
            ("auto", compare(t_auto, &auto, &off)),
        ] {
            let line = format!(
                "{key}\t{e}\t{mode}\t{:.3}\t{}\t{}\t{}\t{}",
                r.seconds, r.prefilled, r.same_best, r.same_bits, r.decisions
            );
            println!(
                "# episode {e} {mode}: {:.2} s, {} tokens, {}/{} bit for bit",
                r.seconds, r.prefilled, r.same_bits, r.decisions
            );
            lines.push(line);
        }
        if let Some(path) = log {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            for l in lines.drain(..) {
                writeln!(f, "{l}").unwrap_or_else(|e| panic!("{path}: {e}"));
            }
        }
    }
    let text = match log {
        Some(path) => std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")),
        None => lines.join("\n"),
    };
    summarize(&text, key);
}

/// The table over every episode `text` (log lines) holds under `key`; a later line for the same
/// episode and mode replaces an earlier one.
fn summarize(text: &str, key: &str) {
    let mut latest: BTreeMap<(usize, String), Vec<f64>> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 8 || f[0] != key {
            continue;
        }
        let nums: Vec<f64> = f[3..]
            .iter()
            .map(|v| v.parse().unwrap_or(f64::NAN))
            .collect();
        let episode = f[1].parse().unwrap_or(usize::MAX);
        latest.insert((episode, f[2].to_string()), nums);
    }
    let eps: std::collections::BTreeSet<usize> = latest.keys().map(|(e, _)| *e).collect();
    println!("# {key}: episodes {eps:?} ({} in all)", eps.len());
    println!("| configuration | s | decisions/s | prompt tokens prefilled | vs reuse off | same best as off | scores bit for bit = off |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let total = |mode: &str| -> [f64; 5] {
        let mut t = [0.0; 5];
        for ((e, m), v) in &latest {
            // Only episodes both modes finished count, so the two sums cover the same decisions.
            if m == mode
                && latest.contains_key(&(*e, "off".into()))
                && latest.contains_key(&(*e, "auto".into()))
            {
                for (a, b) in t.iter_mut().zip(v) {
                    *a += b;
                }
            }
        }
        t
    };
    let off = total("off");
    for mode in ["off", "auto"] {
        let [s, tok, best, bits, n] = total(mode);
        println!(
            "| first_token, reuse {mode} | {s:.2} | {:.2} | {tok} | {:.2}x | {best}/{n} | {bits}/{n} |",
            n / s,
            off[0] / s
        );
    }
}
