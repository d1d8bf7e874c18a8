//! Prediction and reads ahead (`prefetch`): after each routing node, the next MoE layer's
//! experts predicted (from its router, or as the layer's last routing) and read on lanes of
//! their own, but only while that pays: enough of the recent candidates must have been misses,
//! and more than the share of decode spent waiting for reads.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::io::DirectReader;
use crate::options::{Prefetch, StreamOptions};
use crate::telemetry::StreamCounters;

use super::cache::MAX_PREFETCH_TOKENS;
use super::prefetch::{Predictor, Prefetcher, Source};
use super::setup_err;

/// Reader lanes (and threads) of their own for reads ahead.
const PREFETCH_LANES: usize = 2;

/// Reads ahead stop while fewer than this share of recent candidates were misses.
const MIN_PRECISION: f64 = 0.5;
/// Candidates scored before the share is trusted.
const CANDIDATE_WARMUP: f64 = 64.0;
/// The candidates' counts are halved past this, so the share follows recent routing.
const CANDIDATE_WINDOW: f64 = 512.0;

/// While reads ahead are paused, predictions are still made and scored, on one routing node in
/// this many (prime, so the sampled layers rotate from token to token): a prediction costs a
/// copy of the router input and a matrix-vector product on the compute thread, most of a
/// percent of decode each on a small machine, for reads that are not issued.
const PAUSED_SAMPLE: u64 = 7;

/// What reads ahead delivered is multiplied by this at each sampled node while they are paused.
const AHEAD_FADE: f64 = 0.99;

/// Weight of the newest decode-sized routing node in the read share (an exponential average over
/// about this many nodes' inverse).
const READ_SHARE_WEIGHT: f64 = 1.0 / 32.0;

/// Reader lanes reads ahead take when a predictor runs.
pub(super) fn lanes(predicts: bool) -> usize {
    if predicts {
        PREFETCH_LANES
    } else {
        0
    }
}

/// A recent count and how many of it paid, decayed: halved once the count passes
/// `CANDIDATE_WINDOW`, so the share follows recent routing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Tally {
    /// Counted lately.
    n: f64,
    /// Of those, the ones that paid.
    paid: f64,
}

impl Tally {
    /// Adds `n` counted, `paid` of them paying.
    fn add(&mut self, n: f64, paid: f64) {
        self.n += n;
        self.paid += paid;
        if self.n > CANDIDATE_WINDOW {
            self.n /= 2.0;
            self.paid /= 2.0;
        }
    }
}

/// Decode's wait at routing nodes (reads) and compute between them, in seconds, each averaged
/// over recent decode-sized nodes: wait / (wait + compute) is how read-bound decode is.
#[derive(Debug, Clone, Copy, Default)]
struct ReadShare {
    wait: f64,
    compute: f64,
    /// When the last decode-sized routing node was done (`None` after a wider piece), to time
    /// the compute between nodes.
    last_end: Option<Instant>,
}

impl ReadShare {
    /// The share of recent decode time spent waiting at routing nodes, 0 before any was timed.
    fn bound(&self) -> f64 {
        let (w, c) = (self.wait, self.compute);
        if w + c > 0.0 {
            w / (w + c)
        } else {
            0.0
        }
    }

    /// Folds one routing node (begun at `t0`, done at `end`) into the share: its wait against the
    /// compute since the node before it. Only between decode-sized nodes: a prompt piece's
    /// compute is not what reads ahead would overlap.
    fn time_node(&mut self, t0: Instant, end: Instant, decode_sized: bool) {
        if let (true, Some(before)) = (decode_sized, self.last_end) {
            let (wait, compute) = (
                end.duration_since(t0).as_secs_f64(),
                t0.duration_since(before).as_secs_f64(),
            );
            // A gap of a second or more is the caller's (the next call), not compute. Wait and
            // compute are averaged apart and divided after: a mean of per-node shares would
            // weigh a node that hit everything as much as one that waited 50 ms.
            if compute < 1.0 {
                self.wait += READ_SHARE_WEIGHT * (wait - self.wait);
                self.compute += READ_SHARE_WEIGHT * (compute - self.compute);
            }
        }
        self.last_end = decode_sized.then_some(end);
    }
}

/// The last prediction made, scored at its layer's routing node.
pub(super) struct Prediction {
    /// The layer predicted for.
    layer: u32,
    /// The experts predicted.
    experts: Vec<u32>,
    /// Those not resident when predicted: the candidates to read ahead.
    candidates: Vec<u32>,
}

/// The streamer's prediction and read-ahead policy, and the prefetcher that reads.
pub(super) struct ReadAhead {
    predictor: Option<Predictor>,
    prefetcher: Option<Prefetcher>,
    /// Per layer, the experts its last routing node chose (the `repeat` predictor).
    last_routed: BTreeMap<u32, Vec<u32>>,
    prediction: Option<Prediction>,
    /// Recent reads-ahead candidates and how many of them turned out to be misses: reads ahead
    /// are issued only while enough of them pay (see `worth_reading_ahead`).
    candidates: Tally,
    /// Routing nodes seen while reads ahead were paused (see `PAUSED_SAMPLE`).
    paused_nodes: u64,
    /// Experts read ahead and how many of them served a miss: what reads ahead really delivered.
    delivered: Tally,
    /// The prefetcher's (issued, used) when last counted into `delivered`.
    issued_seen: u64,
    used_seen: u64,
    read_share: ReadShare,
}

impl ReadAhead {
    /// The policy over `predictor`, with the prefetcher's threads started on lanes after the
    /// streamer's `opts.io_threads` of `reader` when there is a predictor.
    pub(super) fn start(
        predictor: Option<Predictor>,
        reader: &Arc<DirectReader>,
        opts: &StreamOptions,
    ) -> Result<Self> {
        let prefetcher = match predictor {
            Some(_) => Some(
                Prefetcher::new(reader.clone(), opts.io_threads, PREFETCH_LANES, &opts.cpus)
                    .map_err(setup_err("starting prefetch threads"))?,
            ),
            None => None,
        };
        Ok(Self::fresh(predictor, prefetcher))
    }

    /// A policy that has seen nothing yet.
    fn fresh(predictor: Option<Predictor>, prefetcher: Option<Prefetcher>) -> Self {
        Self {
            predictor,
            prefetcher,
            last_routed: BTreeMap::new(),
            prediction: None,
            candidates: Tally::default(),
            paused_nodes: 0,
            delivered: Tally::default(),
            issued_seen: 0,
            used_seen: 0,
            read_share: ReadShare::default(),
        }
    }

    /// The prefetcher, when a predictor runs.
    pub(super) fn prefetcher_mut(&mut self) -> Option<&mut Prefetcher> {
        self.prefetcher.as_mut()
    }

    /// The prefetcher's (issued, used) experts, when a predictor runs.
    pub(super) fn prefetched(&self) -> Option<(u64, u64)> {
        self.prefetcher.as_ref().map(|p| (p.issued, p.used))
    }

    /// The last prediction, when it was for layer `il` (taken either way).
    pub(super) fn take_prediction(&mut self, il: u32) -> Option<Prediction> {
        self.prediction.take().filter(|p| p.layer == il)
    }

    /// Remembers the experts layer `il` routed to (for `repeat`), and counts how many of them
    /// the prediction for it named.
    pub(super) fn routed(
        &mut self,
        il: u32,
        routed: Vec<u32>,
        prediction: Option<&Prediction>,
        counters: &mut StreamCounters,
    ) {
        if let Some(p) = prediction {
            counters.predicted_routed += routed.len() as u64;
            counters.predicted_right +=
                routed.iter().filter(|e| p.experts.contains(e)).count() as u64;
        }
        self.last_routed.insert(il, routed);
    }

    /// Counts how many of a prediction's candidates (predicted, not resident when predicted)
    /// turned out misses, whether or not they were read ahead: that decides whether reads ahead
    /// pay.
    pub(super) fn score(&mut self, prediction: &Prediction, misses: &[bool]) {
        let cands = &prediction.candidates;
        let useful = cands.iter().filter(|&&e| misses[e as usize]).count();
        self.candidates.add(cands.len() as f64, useful as f64);
    }

    /// Folds one routing node (begun at `t0`) into the read share.
    pub(super) fn time_node(&mut self, t0: Instant, decode_sized: bool) {
        self.read_share.time_node(t0, Instant::now(), decode_sized);
    }

    /// Folds what the reads ahead delivered since the last count into `delivered`.
    pub(super) fn count_delivered(&mut self) {
        let Some(p) = &self.prefetcher else {
            return;
        };
        let (issued, used) = (p.issued, p.used);
        let (n, paid) = (issued - self.issued_seen, used - self.used_seen);
        self.delivered.add(n as f64, paid as f64);
        (self.issued_seen, self.used_seen) = (issued, used);
    }

    /// The MoE layer after `il` that a prediction is for, when a predictor and a prefetcher run.
    pub(super) fn next_layer(&self, il: u32) -> Option<u32> {
        match (&self.predictor, &self.prefetcher) {
            (Some(pred), Some(_)) => pred.next_layer(il),
            _ => None,
        }
    }

    /// Whether reads ahead are issued now (a predictor runs and they pay, see
    /// [`worth_reading_ahead`]); while they are not, their staging is lent to the cache.
    pub(super) fn reading(&self) -> bool {
        match (&self.predictor, &self.prefetcher) {
            (Some(pred), Some(_)) => worth_reading_ahead(
                self.candidates,
                self.delivered,
                self.read_share.bound(),
                pred.mode(),
            ),
            _ => false,
        }
    }

    /// Predicts layer `next`'s experts from the router input `router_input` gives (`n_embd` and
    /// its rows; asked for only when a prediction is made) and remembers the prediction; the
    /// candidates (`dims`: below `n_expert`, and not `resident`) to read ahead now, when reads
    /// ahead pay. While they do not, a node in `PAUSED_SAMPLE` still predicts, so the share
    /// stays known.
    pub(super) fn predict(
        &mut self,
        next: u32,
        router_input: impl FnOnce() -> Option<(usize, Vec<f32>)>,
        (n_expert, n_used): (u32, usize),
        resident: impl Fn(u32) -> bool,
        counters: &mut StreamCounters,
    ) -> Option<Vec<u32>> {
        let pred = self.predictor.as_ref()?;
        let reading = worth_reading_ahead(
            self.candidates,
            self.delivered,
            self.read_share.bound(),
            pred.mode(),
        );
        // While warming up every node predicts, so the share is known within a few tokens.
        let warm = self.candidates.n >= CANDIDATE_WARMUP;
        if !reading && warm {
            self.paused_nodes += 1;
            if !self.paused_nodes.is_multiple_of(PAUSED_SAMPLE) {
                return None;
            }
            // What reads ahead delivered fades while they are off (from the window's 512 below
            // the 64 that count in about 200 sampled nodes), so they are tried again.
            self.delivered.n *= AHEAD_FADE;
            self.delivered.paid *= AHEAD_FADE;
        }
        let t0 = Instant::now();
        let predicted = match pred.mode() {
            Prefetch::Repeat => self.last_routed.get(&next).cloned().unwrap_or_default(),
            _ => match router_input() {
                Some((n_embd, x)) if n_embd > 0 && x.len() / n_embd <= MAX_PREFETCH_TOKENS => {
                    pred.predict(next, &x, n_embd, n_used)
                }
                _ => return None,
            },
        };
        counters.predict_s += t0.elapsed().as_secs_f64();
        let experts: Vec<u32> = predicted
            .iter()
            .copied()
            .filter(|&e| e < n_expert && !resident(e))
            .collect();
        self.prediction = Some(Prediction {
            layer: next,
            experts: predicted,
            candidates: experts.clone(),
        });
        reading.then_some(experts)
    }

    /// Reads `experts` of layer `next` ahead from `sources` (one per expert matrix).
    pub(super) fn issue(&mut self, next: u32, experts: &[u32], sources: &[Source]) {
        if let Some(pf) = self.prefetcher.as_mut() {
            pf.issue(next, experts, sources);
        }
    }
}

/// Whether reads ahead pay: at least `MIN_PRECISION` of the recent candidates were misses
/// (each wrong one costs a read and CPU time for its copy, which on a small machine competes
/// with compute), and more than the share of decode spent waiting for reads (`read_share`).
/// A read ahead can hide at most the compute it overlaps, C per node, while the storage
/// still reads every byte; a candidate that is not used adds its read to the R a node
/// already waits for. With a share p of candidates used, the waste per useful read is
/// (1 - p) / p of it, so reads ahead pay only where C / R > (1 - p) / p, that is where p is
/// above R / (R + C), the read share. Ten times larger than its memory (bench10), decode
/// waited for reads 81-92% of the time, and reads ahead on made it 1.5-1.8x slower.
/// Nothing is read until `CANDIDATE_WARMUP` candidates were scored: reading while the share
/// is unknown cost the bench preset 65 wasted reads (1.0 MiB a token over 64 tokens) on
/// routing too scattered to predict. Predictions keep being scored while reads are off, so
/// they come back when the routing becomes predictable. `eager` and the always-wrong control
/// read regardless.
///
/// The same bar holds for what the reads ahead really delivered (`delivered`: experts read
/// ahead and how many served a miss), once `CANDIDATE_WARMUP` were read: a candidate scored as
/// a miss is not always served in time, and on bench10 at 52% cache hits, 80% of candidates
/// were misses, over the 74% read share, while 62% of the reads ahead were used, and decode
/// ran 1.43x slower than with reads ahead off. While paused that record fades (see
/// [`ReadAhead::predict`]), so reads ahead are tried again now and then.
fn worth_reading_ahead(
    candidates: Tally,
    delivered: Tally,
    read_share: f64,
    mode: Prefetch,
) -> bool {
    let bar = MIN_PRECISION.max(read_share);
    let (Tally { n, paid: u }, Tally { n: r, paid: used }) = (candidates, delivered);
    matches!(mode, Prefetch::Wrong | Prefetch::Eager)
        || (n >= CANDIDATE_WARMUP && u >= bar * n && (r < CANDIDATE_WARMUP || used >= bar * r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(n: f64, paid: f64) -> Tally {
        Tally { n, paid }
    }

    #[test]
    fn reads_ahead_pause_while_few_candidates_turn_out_misses() {
        let worth =
            |c: (f64, f64), mode| worth_reading_ahead(t(c.0, c.1), Tally::default(), 0.1, mode);
        // Until 64 candidates were scored the share is not trusted, and nothing is read.
        assert!(!worth(
            (CANDIDATE_WARMUP - 1.0, CANDIDATE_WARMUP - 1.0),
            Prefetch::Router
        ));
        // Then at least half of them must have been misses.
        assert!(!worth((100.0, 49.0), Prefetch::Router));
        assert!(worth((100.0, 50.0), Prefetch::Router));
        assert!(!worth((100.0, 10.0), Prefetch::Repeat));
        // `eager` and the always-wrong control read regardless.
        assert!(worth((100.0, 0.0), Prefetch::Wrong));
        assert!(worth((0.0, 0.0), Prefetch::Eager));
        // Read-bound (85% of decode waiting): 80% of candidates used is not enough, 90% is.
        let bound = |u| worth_reading_ahead(t(100.0, u), Tally::default(), 0.85, Prefetch::Router);
        assert!(!bound(80.0));
        assert!(bound(90.0));
        // Candidates that pass, reads ahead that did not deliver: paused; too few read to tell,
        // or delivering: on.
        let ahead = |a: (f64, f64)| {
            worth_reading_ahead(t(100.0, 80.0), t(a.0, a.1), 0.74, Prefetch::Router)
        };
        assert!(!ahead((100.0, 62.0)));
        assert!(ahead((60.0, 0.0)));
        assert!(ahead((100.0, 80.0)));
    }

    #[test]
    fn a_tally_halves_past_its_window() {
        let mut c = Tally::default();
        c.add(500.0, 250.0);
        assert_eq!(c, t(500.0, 250.0));
        c.add(20.0, 20.0);
        assert_eq!(c, t(260.0, 135.0));
    }

    #[test]
    fn the_read_share_averages_decode_nodes_only() {
        let mut s = ReadShare::default();
        assert_eq!(s.bound(), 0.0);
        let t0 = Instant::now();
        // The first decode node has nothing before it to time compute from.
        s.time_node(t0, t0 + Duration::from_millis(10), true);
        assert_eq!(s.bound(), 0.0);
        // 10 ms of compute, then 10 ms waiting: half of decode waits.
        let t1 = t0 + Duration::from_millis(20);
        s.time_node(t1, t1 + Duration::from_millis(10), true);
        assert!((s.bound() - 0.5).abs() < 1e-9, "{}", s.bound());
        // A prompt piece is not timed, and the next decode node has nothing before it.
        let t2 = t1 + Duration::from_millis(30);
        s.time_node(t2, t2 + Duration::from_millis(500), false);
        assert!(s.last_end.is_none());
        assert!((s.bound() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn predictions_are_scored_against_the_misses() {
        let mut a = ReadAhead::fresh(None, None);
        let p = Prediction {
            layer: 3,
            experts: vec![0, 1, 2],
            candidates: vec![1, 2],
        };
        a.score(&p, &[false, true, false]);
        assert_eq!(a.candidates, t(2.0, 1.0));
        let mut counters = StreamCounters::default();
        a.routed(3, vec![1, 4], Some(&p), &mut counters);
        assert_eq!(
            (counters.predicted_routed, counters.predicted_right),
            (2, 1)
        );
        assert_eq!(a.last_routed[&3], vec![1, 4]);
        // Without a predictor nothing is predicted, and the prediction is for one layer only.
        assert_eq!(a.next_layer(2), None);
        a.prediction = Some(p);
        assert!(a.take_prediction(4).is_none());
        assert!(a.prediction.is_none());
    }
}
