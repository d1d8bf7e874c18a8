//! `--machine`: one `BMOE_DECIDE {json}` or `BMOE_DONE {json}` line per row on stdout, flat JSON
//! with upstream's field names (upstream-bmoe-facts.md 3.2) plus the row's identity.
use std::io::Write;

use serde_json::{json, Value};

use crate::config::job::Kind;
use crate::sink::row::{parse_logp, Row};

/// The line for one row.
pub fn line(kind: Kind, r: &Row) -> String {
    let logp: Vec<Value> = parse_logp(&r.choice_logp)
        .unwrap_or_default()
        .into_iter()
        .map(|x| {
            serde_json::Number::from_f64(x)
                .map(Value::Number)
                .unwrap_or(Value::Null)
        })
        .collect();
    let v = match kind {
        Kind::Decide => json!({
            "id": r.item,
            "cancelled": r.cancelled,
            "best": r.best,
            "choice_logp": logp,
            "n_tokens": r.n_prompt,
            "n_prefilled": r.n_prompt,
            "prefill_s": r.prefill_s,
            "prefill_read_mib": r.read_mib,
            "prefill_io_s": r.io_s,
            "prefill_stall_s": r.stall_s,
            "prefill_dev_tokens": r.prefill_dev_tokens,
            "prefill_dev_nodes": r.prefill_dev_nodes,
            "prefill_dev_read_mib": r.prefill_dev_read_mib,
            "prefill_dev_stall_s": r.prefill_dev_stall_s,
            "prefill_dev_routed": r.prefill_dev_routed,
            "prefill_dev_demand": r.prefill_dev_demand,
            "error": r.error,
            "run_id": r.run_id,
            "job": r.job,
            "profile": r.profile,
            "point": r.point,
            "repeat": r.repeat,
        }),
        _ => json!({
            "id": r.item,
            "cancelled": r.cancelled,
            "tokens": r.tokens,
            "tok_s": r.tok_s,
            "prefill_s": r.prefill_s,
            "prefill_tps": r.prefill_tps,
            "load_s": r.load_s,
            "cache_hit_pct": r.cache_hit_pct,
            "n_prompt": r.n_prompt,
            "read_mib": r.read_mib,
            "cache_resident_mib": r.cache_resident_mib,
            "cache_budget_mib": r.cache_mb,
            "prefill_dev_tokens": r.prefill_dev_tokens,
            "prefill_dev_nodes": r.prefill_dev_nodes,
            "prefill_dev_read_mib": r.prefill_dev_read_mib,
            "prefill_dev_stall_s": r.prefill_dev_stall_s,
            "ppl": r.ppl,
            "nll_mean": r.nll_mean,
            "error": r.error,
            "run_id": r.run_id,
            "job": r.job,
            "profile": r.profile,
            "point": r.point,
            "repeat": r.repeat,
            "text": r.text,
        }),
    };
    let tag = if kind == Kind::Decide {
        "BMOE_DECIDE"
    } else {
        "BMOE_DONE"
    };
    format!("{tag} {v}")
}

/// Prints the line and flushes, so a reader sees each row as it lands.
pub fn emit(kind: Kind, r: &Row) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line(kind, r));
    let _ = out.flush();
}
