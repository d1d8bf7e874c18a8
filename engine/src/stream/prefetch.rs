//! Expert prefetch: at a layer's routing node, the next MoE layer's router applied to this layer's
//! router input predicts what the next layer will route to (the residual stream changes little
//! from one layer to the next). The predicted experts that are not resident are read on lanes of
//! their own into staging buffers while this layer computes; the next routing node takes what has
//! arrived, waits for what is still in flight and reads the rest itself. A wrong prediction only
//! costs bandwidth: staged bytes are the file's bytes of exactly the (layer, expert) they were read
//! for, and they are used only when that expert is routed to.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use crate::ffi::quant;
use crate::ffi::region::Region;
use crate::ffi::tensor::TensorPtr;
use crate::io::DirectReader;
use crate::options::Prefetch;
use crate::weights::table::ExpertMatrix;
use crate::weights::Quiet;

/// One layer's router as f32 rows, one per expert.
struct Router {
    n_embd: usize,
    rows: Vec<f32>,
}

/// The routers of every MoE layer, dequantized once.
pub(crate) struct Predictor {
    routers: BTreeMap<u32, Router>,
    mode: Prefetch,
}

impl Predictor {
    /// Whether `new` will make a predictor: prefetch is on and every router's type has an f32
    /// converter.
    pub(crate) fn possible(routers: &BTreeMap<u32, TensorPtr>, mode: Prefetch) -> bool {
        mode != Prefetch::Off
            && (mode == Prefetch::Repeat
                || routers.values().all(|w| quant::has_f32(w.layout().ty())))
    }

    /// Dequantizes the routers the capture found; `None` when a router's type has no f32
    /// converter (prefetch then stays off).
    pub(crate) fn new(
        routers: &BTreeMap<u32, TensorPtr>,
        mode: Prefetch,
        quiet: &Quiet<'_>,
    ) -> Option<Predictor> {
        if !Self::possible(routers, mode) {
            return None;
        }
        let mut out = BTreeMap::new();
        for (&il, w) in routers {
            let [n_embd, n_expert, ..] = w.ne();
            let n = (n_embd * n_expert) as usize;
            // `repeat` never applies a router: only the layer order is needed.
            let rows = match mode {
                Prefetch::Repeat => Vec::new(),
                _ => quant::to_f32(w.layout().ty(), w.bytes(quiet)?, n)?,
            };
            out.insert(
                il,
                Router {
                    n_embd: n_embd as usize,
                    rows,
                },
            );
        }
        Some(Predictor { routers: out, mode })
    }

    /// How it predicts.
    pub(crate) fn mode(&self) -> Prefetch {
        self.mode
    }

    /// The MoE layer after `il` (the first one after the last: the next token's).
    pub(crate) fn next_layer(&self, il: u32) -> Option<u32> {
        self.routers
            .range(il + 1..)
            .next()
            .or_else(|| self.routers.iter().next())
            .map(|(&l, _)| l)
    }

    /// The `k` experts `layer`'s router ranks highest for any of the token rows of `x` (rows of
    /// `n_embd` values), or lowest in `Wrong` mode.
    pub(crate) fn predict(&self, layer: u32, x: &[f32], n_embd: usize, k: usize) -> Vec<u32> {
        let Some(r) = self.routers.get(&layer) else {
            return Vec::new();
        };
        if r.n_embd != n_embd || n_embd == 0 {
            return Vec::new();
        }
        let mut picked = HashSet::new();
        for tok in x.chunks_exact(n_embd) {
            let mut scored: Vec<(f32, u32)> = r
                .rows
                .chunks_exact(n_embd)
                .enumerate()
                .map(|(e, w)| (dot(w, tok), e as u32))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
            if self.mode == Prefetch::Wrong {
                scored.reverse();
            }
            picked.extend(scored.iter().take(k).map(|&(_, e)| e));
        }
        let mut v: Vec<u32> = picked.into_iter().collect();
        v.sort_unstable();
        v
    }
}

/// `a . b` in eight running sums, which the compiler keeps in vector registers (one serial sum
/// waits on every add); the order of additions differs from a plain sum, which moves a score by
/// rounding only, and a prediction never changes a result.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = [0f32; 8];
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One expert read ahead: its bytes per expert tensor of the layer, in the layer's tensor order,
/// each in pages of its own that the routing node can move into the tensor's region.
struct Staged {
    layer: u32,
    expert: u32,
    bytes: std::io::Result<Vec<Region>>,
}

/// Where one expert tensor of a layer lives in the file.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// Each expert's pieces on disk, in memory order.
    pub(crate) parts: Vec<crate::gguf::index::ExpertPart>,
    /// Bytes of one expert (the pieces' sum).
    pub(crate) expert_bytes: usize,
    /// How the expert is repacked into the CPU's layout, on the lane that reads it (`None`: the
    /// file's layout).
    pub(crate) repack: Option<crate::ffi::repack::ExpertRepack>,
}

/// The reads in flight and the experts that arrived.
pub(crate) struct Prefetcher {
    reader: Arc<DirectReader>,
    lane_base: usize,
    pool: super::read_threads::ReadThreads,
    tx: Sender<Staged>,
    rx: Receiver<Staged>,
    pending: HashSet<(u32, u32)>,
    staged: HashMap<(u32, u32), Vec<Region>>,
    /// Experts read ahead.
    pub(crate) issued: u64,
    /// Misses served from a read ahead.
    pub(crate) used: u64,
}

impl Prefetcher {
    /// Reads on `lanes` threads of their own (the demand reads at routing nodes never queue
    /// behind a prefetch), using lanes `lane_base..` of `reader`.
    pub(crate) fn new(
        reader: Arc<DirectReader>,
        lane_base: usize,
        lanes: usize,
        cpus: &[usize],
    ) -> std::io::Result<Prefetcher> {
        let pool = super::read_threads::ReadThreads::new(lanes, "bmoe-prefetch", cpus)?;
        let (tx, rx) = channel();
        Ok(Prefetcher {
            reader,
            lane_base,
            pool,
            tx,
            rx,
            pending: HashSet::new(),
            staged: HashMap::new(),
            issued: 0,
            used: 0,
        })
    }

    /// Starts reading `experts` of `layer` (each tensor's slice per `sources`) unless already in
    /// flight or arrived. Anything staged or pending for other layers is dropped first: only the
    /// next layer's reads are kept.
    pub(crate) fn issue(&mut self, layer: u32, experts: &[u32], sources: &[Source]) {
        self.drain();
        self.staged.retain(|&(l, _), _| l == layer);
        self.pending.retain(|&(l, _)| l == layer);
        for &e in experts {
            if !self.pending.insert((layer, e)) {
                continue;
            }
            if self.staged.contains_key(&(layer, e)) {
                self.pending.remove(&(layer, e));
                continue;
            }
            self.issued += 1;
            let (reader, tx, lane_base) = (self.reader.clone(), self.tx.clone(), self.lane_base);
            let sources = sources.to_vec();
            self.pool.spawn(move |lane| {
                let lane = lane_base + lane;
                // The pages are touched here, on the reader's thread, not by the compute thread
                // that later takes them.
                let bytes = sources
                    .iter()
                    .map(|s| {
                        let mut buf = Region::reserve(s.expert_bytes)?;
                        let pieces: Vec<_> = ExpertMatrix::pieces(&s.parts, e as usize).collect();
                        super::repacked::read_into(
                            &reader,
                            lane,
                            &pieces,
                            &mut buf.as_mut_slice()[..s.expert_bytes],
                            s.repack.as_ref(),
                        )?;
                        Ok(buf)
                    })
                    .collect();
                // The streamer may be gone (model dropped): nothing to deliver to.
                let _ = tx.send(Staged {
                    layer,
                    expert: e,
                    bytes,
                });
            });
        }
    }

    /// Moves what has arrived into `staged` without waiting.
    fn drain(&mut self) {
        while let Ok(s) = self.rx.try_recv() {
            self.arrive(s);
        }
    }

    fn arrive(&mut self, s: Staged) {
        let key = (s.layer, s.expert);
        // Only what is still expected: a read for a layer already passed is dropped.
        if self.pending.remove(&key) {
            if let Ok(b) = s.bytes {
                self.staged.insert(key, b);
            }
        }
    }

    /// The read-ahead bytes of (`layer`, `expert`), waiting while its read is in flight; `None`
    /// when it was not read ahead (or its read failed: the caller reads it itself).
    pub(crate) fn take(&mut self, layer: u32, expert: u32) -> Option<Vec<Region>> {
        let key = (layer, expert);
        self.drain();
        while self.pending.contains(&key) {
            match self.rx.recv() {
                Ok(s) => self.arrive(s),
                Err(_) => break,
            }
        }
        let got = self.staged.remove(&key);
        if got.is_some() {
            self.used += 1;
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::dot;

    #[test]
    fn dot_matches_a_plain_sum_for_every_tail_length() {
        for n in [0, 1, 7, 8, 9, 1024, 1031] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0)
                .collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
            let got = f64::from(dot(&a, &b));
            assert!(
                (got - plain).abs() <= 1e-3 * plain.abs().max(1.0),
                "n={n}: {got} vs {plain}"
            );
        }
    }
}
