//! Each streamed point's decode against its floor: the storage time of decode's own reads at the
//! rate probed before the point (`disk_probe`) plus the compute time the reference point (every
//! expert in memory) decodes a token in. 1.0x is a decode that waits for nothing it did not have
//! to read and computes as fast as resident.
use super::group::{Floor, Group, FLOOR_METHOD};
use super::input::{Data, Rec};
use super::metrics::{metric_values, row_metric};
use crate::compare::stats::{floor_ratio_95, median};

/// A row's decode time a token and its read floor's share, seconds: `None` where the row lacks
/// the decode, its reads (`decode_read_mib`) or the probe (`disk_mib_s`).
fn row_floor(d: &Data, r: &Rec) -> Option<(f64, f64)> {
    if r.failed {
        return None;
    }
    let tokens = d.num(r, "tokens").filter(|t| *t > 0.0)?;
    let rate = d.num(r, "disk_mib_s").filter(|v| *v > 0.0)?;
    let read = d.num(r, "decode_read_mib")?;
    let tps = row_metric(d, r, "decode_tps")?;
    Some((1.0 / tps, read / tokens / rate))
}

/// Whether a reference row can stand for the compute floor, every expert in memory: not
/// streamed, and under no memory limit smaller than its model (llama.cpp's mmap path under a cap
/// waits on the page cache, which is no floor).
fn resident(d: &Data, r: &Rec) -> bool {
    let limit = d.num(r, "memory_limit_mib");
    let roomy = match (limit, d.num(r, "model_bytes")) {
        (None, _) => true,
        (Some(mib), Some(bytes)) => mib * (1u64 << 20) as f64 >= bytes,
        (Some(_), None) => false,
    };
    r.moe_stream == Some(false) && roomy
}

/// The floor of each group in `idx` but the reference's, where its rows have what it needs and
/// every row of the reference is resident.
pub(super) fn floor(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
    let rows = out[ref_i].members.iter().map(|&i| &d.recs[i]);
    if rows.filter(|r| !r.failed).any(|r| !resident(d, r)) {
        return;
    }
    let base: Vec<f64> = metric_values(d, &out[ref_i], "decode_tps")
        .iter()
        .map(|v| 1.0 / v)
        .collect();
    if base.is_empty() {
        return;
    }
    let compute = median(&mut base.clone());
    for &gi in idx.iter().filter(|&&gi| gi != ref_i) {
        let rows: Vec<(f64, f64)> = out[gi]
            .members
            .iter()
            .filter_map(|&i| row_floor(d, &d.recs[i]))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let mut t: Vec<f64> = rows.iter().map(|r| r.0).collect();
        let mut r: Vec<f64> = rows.iter().map(|r| r.1).collect();
        let (decode, read) = (median(&mut t), median(&mut r));
        let (low, high) = floor_ratio_95(&rows, &base);
        out[gi].floor = Some(Floor {
            reference: out[ref_i].label.clone(),
            value: decode / (read + compute),
            low,
            high,
            decode_ms: decode * 1e3,
            read_ms: read * 1e3,
            compute_ms: compute * 1e3,
            interval_method: FLOOR_METHOD,
        });
    }
}
