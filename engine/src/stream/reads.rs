//! The streamer's reads of missed experts from the file: on the calling thread where waking the
//! reader lanes costs more than it saves, on the lanes otherwise, and a decode node's repacked
//! slices each repacked while the next is read.
use std::sync::Arc;

use rayon::prelude::*;

use crate::error::Result;
use crate::ffi::region::Region;
use crate::ffi::repack::ExpertRepack;
use crate::io::DirectReader;
use crate::options::StreamOptions;
use crate::telemetry::StreamCounters;
use crate::weights::table::ExpertMatrix;

use super::{repacked, setup_err};

/// Below this many bytes per routing node, reads run on the calling thread.
const INLINE_READ_BYTES: usize = 1 << 20;

/// A decode-sized routing node with fewer expert slices than this to read reads them on the
/// calling thread; with more, on the lanes. A model that mostly hits its cache misses an expert
/// or two per layer (3-6 slices), where waking the lanes costs more than it saves; ten times
/// larger than its memory, a layer misses most of its eight experts (about 24 slices), and
/// random 576 KiB `O_DIRECT` reads four at a time ran at 1.45x the rate of one at a time here
/// (`scripts/bench-disk`).
const DECODE_INLINE_SLICES: usize = 8;

/// The streamer's I/O: the model's direct reader, the lanes it reads on and the thread that
/// repacks decode's slices.
pub(super) struct Reads {
    reader: Arc<DirectReader>,
    pool: rayon::ThreadPool,
    /// Two read buffers a decode node's repacked slices are read into, each repacked out of one
    /// while the next is read into the other (`repacked::run_pipelined`).
    pipe: Vec<Region>,
    /// The thread that repacks out of `pipe`.
    repacker: rayon::ThreadPool,
    /// Reader lanes this streamer reads on (`0..own_lanes`), read-ahead lanes included.
    own_lanes: usize,
    /// Whether each file is read with O_DIRECT.
    direct: Vec<bool>,
}

impl Reads {
    /// Checks that `reader` has the `own_lanes` lanes and the bounce buffer for `max_read` bytes
    /// the streamer needs.
    pub(super) fn check(reader: &DirectReader, own_lanes: usize, max_read: usize) -> Result<()> {
        if reader.lanes() < own_lanes || reader.max_read() < max_read {
            return Err(setup_err("sharing the model's reader")(
                std::io::Error::other(
                    "the reader has fewer lanes or a smaller bounce buffer than the streamer needs",
                ),
            ));
        }
        Ok(())
    }

    /// The reader lanes' pool (one thread per I/O thread, pinned to `opts.cpus`), the read
    /// buffers and the repacking thread, on a reader [`Self::check`]ed.
    pub(super) fn start(
        reader: Arc<DirectReader>,
        opts: &StreamOptions,
        own_lanes: usize,
    ) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.io_threads.max(1))
            .thread_name(|i| format!("bmoe-io-{i}"))
            // Off the compute threads' cores where the caller named others; a failed pin leaves
            // the thread where the kernel put it (slower at worst, never wrong).
            .start_handler({
                let cpus = opts.cpus.clone();
                move |_| {
                    let _ = crate::ffi::affinity::pin_current_thread(&cpus);
                }
            })
            .build()
            .map_err(|e| setup_err("starting reader threads")(std::io::Error::other(e)))?;
        let direct = reader.direct().to_vec();
        let pipe = (0..2)
            .map(|_| reader.bounce())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(setup_err("reserving read buffers"))?;
        let repacker = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "bmoe-repack".into())
            .build()
            .map_err(|e| setup_err("starting the repacking thread")(std::io::Error::other(e)))?;
        Ok(Self {
            reader,
            pool,
            pipe,
            repacker,
            own_lanes,
            direct,
        })
    }

    /// The reader's lanes after the streamer's own.
    pub(super) fn later_lanes(&self) -> crate::io::Lanes {
        crate::io::Lanes::new(self.reader.clone(), self.own_lanes)
    }

    /// Whether each file is read with O_DIRECT.
    pub(super) fn direct(&self) -> &[bool] {
        &self.direct
    }

    /// Reads the jobs and counts their time and bytes; the first error, if any, after all ran.
    pub(super) fn run(
        &mut self,
        jobs: Vec<repacked::Job<'_>>,
        decode_sized: bool,
        counters: &mut StreamCounters,
    ) -> std::io::Result<()> {
        let total: usize = jobs.iter().map(|j| j.dst.len()).sum();
        let reader = &*self.reader;
        // Small batches, and a decode-sized graph's few misses, are read on the calling thread,
        // whose compute threads wait for them anyway. Waking the lanes costs more than it saves
        // there: rayon's idle lanes spin and yield for a while after each batch, on the very
        // cores the next graph's compute threads need. Many misses (`DECODE_INLINE_SLICES`) go
        // to the lanes, where reads in flight together run faster.
        let results: Vec<std::io::Result<repacked::Done>> = if total < INLINE_READ_BYTES
            || jobs.len() < 2
            || (decode_sized && jobs.len() < DECODE_INLINE_SLICES)
        {
            // A decode node's few repacked slices: each repacked while the next is read.
            if decode_sized && self.pipe.len() >= 2 && repacked::pipelines(&jobs) {
                repacked::run_pipelined(reader, 0, jobs, &mut self.pipe, &self.repacker)
            } else {
                jobs.into_iter().map(|j| j.run(reader, 0)).collect()
            }
        } else {
            self.pool.install(|| {
                jobs.into_par_iter()
                    .map(|j| j.run(reader, rayon::current_thread_index().unwrap_or(0)))
                    .collect()
            })
        };
        count_done(results, counters)
    }
}

/// Counts what the reads did; the first error, if any.
fn count_done(
    results: Vec<std::io::Result<repacked::Done>>,
    counters: &mut StreamCounters,
) -> std::io::Result<()> {
    let mut first_err = None;
    for r in results {
        match r {
            Ok(d) => {
                counters.read_s += d.read_s;
                counters.read_bytes += d.bytes as u64;
                if let Some(s) = d.repack_s {
                    counters.repacked += 1;
                    counters.repack_s += s;
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The reads of each missed expert: one positioned read per piece in the file's layout, or one
/// job per expert (all its pieces, then its repack) where the matrix is repacked.
pub(super) fn read_jobs<'a>(
    pairs: Vec<(&ExpertMatrix, &'a mut Region)>,
    reps: &[Option<&'a ExpertRepack>],
    misses: &[bool],
) -> Vec<repacked::Job<'a>> {
    let mut jobs = Vec::new();
    for ((t, region), rp) in pairs.into_iter().zip(reps) {
        let eb = t.expert_bytes;
        for (e, dst) in region
            .as_mut_slice()
            .chunks_mut(eb)
            .enumerate()
            .take(misses.len())
        {
            if !misses[e] {
                continue;
            }
            if rp.is_some() {
                jobs.push(repacked::Job {
                    dst,
                    pieces: t.pieces_of(e).collect(),
                    repack: *rp,
                });
                continue;
            }
            let mut rest = dst;
            for (file, offset, len) in t.pieces_of(e) {
                let (piece, tail) = rest.split_at_mut(len);
                jobs.push(repacked::Job {
                    dst: piece,
                    pieces: vec![(file, offset, len)],
                    repack: None,
                });
                rest = tail;
            }
        }
    }
    jobs
}
