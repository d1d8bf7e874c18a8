//! `bmoe cache-sim`: replays a routing trace (`routing_trace`) through the streamer's own cache
//! policies and through Belady's offline optimum at each cache size asked for, and prints misses
//! and bytes per token, prompt and decode apart.
use std::process::ExitCode;

use anyhow::Context;
use bmoe_engine::routing_stats::{self, RoutingStats};
use bmoe_engine::sim::{self, PhaseStats, SimResult};
use bmoe_engine::trace::Trace;
use bmoe_engine::CachePolicy;
use serde::Serialize;

use super::output::print_json;
use crate::cli::{CacheSimArgs, Format};

/// One cache size's replays.
#[derive(Serialize)]
struct Point {
    cache_mb: f64,
    /// The streamer's policies asked for, in that order.
    engine: Vec<Replay>,
    belady: SimResult,
}

/// One policy's replay at one size.
#[derive(Serialize)]
struct Replay {
    #[serde(flatten)]
    result: SimResult,
    /// Decode misses over Belady's (`null` where Belady has none).
    decode_ratio: Option<f64>,
}

/// The whole answer, as `--format json` prints it.
#[derive(Serialize)]
struct Answer {
    trace: String,
    recorded_cache_mb: f64,
    prefetch: String,
    /// The policy the run had.
    cache_policy: String,
    /// Decode's routing: popularity skew, reuse between tokens, the prompt's share.
    routing: RoutingStats,
    points: Vec<Point>,
}

/// Runs `bmoe cache-sim`.
pub fn cache_sim(a: CacheSimArgs) -> anyhow::Result<ExitCode> {
    let t = Trace::read(&a.trace)?;
    let recorded = t.header.budget_bytes;
    let policies: Vec<CachePolicy> = if a.policy.is_empty() {
        vec![CachePolicy::NextUse, CachePolicy::Recency]
    } else {
        a.policy.iter().map(|p| p.engine()).collect()
    };
    let sizes: Vec<Option<f64>> = if a.cache_mb.is_empty() {
        vec![None]
    } else {
        a.cache_mb.iter().map(|&m| Some(m)).collect()
    };
    let points: Vec<Point> = sizes
        .iter()
        .map(|m| {
            // The recorded size follows the run's own budget changes (memory pressure).
            let (bytes, follow) = match m {
                Some(m) => ((m * 1048576.0) as u64, false),
                None => (recorded, true),
            };
            let belady = sim::belady(&t, bytes);
            let engine = policies
                .iter()
                .map(|&p| {
                    let result = sim::replay(&t, bytes, follow, p);
                    let decode_ratio = (belady.decode.misses > 0)
                        .then(|| result.decode.misses as f64 / belady.decode.misses as f64);
                    Replay {
                        result,
                        decode_ratio,
                    }
                })
                .collect();
            Point {
                cache_mb: mib(bytes),
                engine,
                belady,
            }
        })
        .collect();
    let answer = Answer {
        trace: a.trace.display().to_string(),
        recorded_cache_mb: mib(recorded),
        prefetch: t.header.prefetch.clone(),
        cache_policy: t.header.cache_policy.clone(),
        routing: routing_stats::stats(&t),
        points,
    };
    match a.format {
        Format::Json => print_json(&answer)?,
        Format::Text => print_text(&answer).context("writing to stdout")?,
    }
    Ok(ExitCode::SUCCESS)
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

/// One table row per (size, policy).
fn print_text(a: &Answer) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let first = a.points.first();
    let tokens = |f: fn(&SimResult) -> PhaseStats| first.map_or(0, |p| f(&p.belady).tokens);
    writeln!(
        out,
        "{}: {} prompt tokens, {} decode tokens; recorded with cache {:.0} MiB, prefetch {}, cache policy {}",
        a.trace,
        tokens(|r| r.prompt),
        tokens(|r| r.decode),
        a.recorded_cache_mb,
        a.prefetch,
        a.cache_policy
    )?;
    let r = &a.routing;
    writeln!(
        out,
        "decode routing (uniform in brackets): top quarter of experts {:.1}% ({:.1}%), first choice repeated {:.1}% ({:.1}%), experts reused {:.1}% ({:.1}%), top-2 overlap {:.1}% ({:.1}%), in the prompt's experts {:.1}%",
        100.0 * r.top_quarter_share,
        100.0 * r.uniform[0],
        100.0 * r.first_repeat,
        100.0 * r.uniform[1],
        100.0 * r.reuse,
        100.0 * r.uniform[2],
        100.0 * r.top2_overlap,
        100.0 * r.uniform[3],
        100.0 * r.prompt_coverage
    )?;
    writeln!(
        out,
        "{:>9}  {:<8} {:>13} {:>14} {:>13} {:>14}  {:>11}",
        "cache MiB",
        "policy",
        "prompt miss/t",
        "prompt MiB/t",
        "decode miss/t",
        "decode MiB/t",
        "vs belady"
    )?;
    for p in &a.points {
        let rows = p.engine.iter().map(|e| (&e.result, Some(e.decode_ratio)));
        for (r, ratio) in rows.chain([(&p.belady, None)]) {
            let ratio = match ratio {
                Some(Some(x)) => format!("{x:.2}x"),
                Some(None) => "-".into(),
                None => String::new(),
            };
            writeln!(
                out,
                "{:>9.1}  {:<8} {:>13.3} {:>14.3} {:>13.3} {:>14.3}  {:>11}",
                p.cache_mb,
                r.policy,
                r.prompt.misses_per_token(),
                mib_f(r.prompt.bytes_per_token()),
                r.decode.misses_per_token(),
                mib_f(r.decode.bytes_per_token()),
                ratio
            )?;
        }
    }
    Ok(())
}

fn mib_f(b: f64) -> f64 {
    b / 1048576.0
}
