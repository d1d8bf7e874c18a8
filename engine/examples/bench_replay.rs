//! A nightly agent replay, side by side in one run: decisions per second with prefix reuse off,
//! auto and on, `first_token` against `sum` scoring, resident or streamed. Run through
//! `scripts/bench-replay`.
//!
//! `bench_replay MODEL [THREADS] [N] [resident|stream] [UBATCH] [all|first_token]` (`first_token`:
//! the `sum` rows are left out)
//!
//! The trace: episodes of 25 steps (one agent task each); each episode starts a new task with a ~1,500-token prefix
//! (instructions, task), every step adds ~60 tokens of history, and each decision ends with a
//! ~40-token screen and 4 choices (two of them sharing a first token, for `sum`).
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

fn trace(n: usize) -> Vec<DecideRequest> {
    (0..n)
        .map(|i| {
            let episode = i / 25;
            let step = i % 25;
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
    let streamed = arg(3).unwrap_or("resident") == "stream";
    let ubatch: u32 = arg(4).and_then(|s| s.parse().ok()).unwrap_or(512);
    let with_sum = arg(5) != Some("first_token");
    let m = Model::load(&LoadOptions {
        stream: streamed.then(|| StreamOptions {
            cache: bmoe_engine::CacheBudget::Mib(256),
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
        if streamed {
            "streamed (cache 256 MiB)"
        } else {
            "resident"
        }
    );
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
        let prefilled: u64 = recs.iter().map(|r| u64::from(r.n_prefilled)).sum();
        // `sum` rows are compared with `sum, reuse off` (the first of them, with itself).
        if scoring == Scoring::Sum && sum_off.is_empty() {
            sum_off = recs.clone();
        }
        let base = if scoring == Scoring::FirstToken {
            &off
        } else {
            &sum_off
        };
        let k = recs
            .iter()
            .zip(base)
            .filter(|(a, b)| a.best == b.best)
            .count();
        let bits =
            |r: &DecideRecord| -> Vec<u64> { r.choice_logp.iter().map(|v| v.to_bits()).collect() };
        let exact = recs
            .iter()
            .zip(base)
            .filter(|(a, b)| bits(a) == bits(b))
            .count();
        let same = format!("{k}/{n} | {exact}/{n}");
        println!(
            "| {name} | {t:.2} | {:.2} | {prefilled} | {:.2}x | {same} |",
            n as f64 / t,
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
