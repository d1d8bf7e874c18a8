//! Reading an expert into its slot, in the file's layout or in the CPU's repacked one
//! (`repack = auto`): a repacked expert is repacked from where its read landed (the lane's bounce
//! buffer; an expert in several pieces is gathered in the reading thread's scratch first) into
//! the slot, on the thread that read it (a reader lane), or, for a decode-sized node's few misses
//! read inline, on the `bmoe-repack` thread while the next is read ([`run_pipelined`]); never on
//! the compute threads' kernels.
use std::cell::RefCell;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;

use std::collections::BTreeMap;

use crate::error::{EngineError, Result};
use crate::ffi::amx::DenseAmx;
use crate::ffi::error::FfiError;
use crate::ffi::region::Region;
use crate::ffi::repack::{CpuRepack, ExpertRepack};
use crate::ffi::tensor::TensorPtr;
use crate::graph::Capture;
use crate::io::DirectReader;
use crate::weights::table::ExpertMatrix;
use crate::weights::Quiet;

use super::layers::Layer;

thread_local! {
    /// The file's bytes of the expert being repacked, per reading thread (the largest expert's
    /// size, kept for the thread's life).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One read into a slot: `pieces` (`(file, offset, bytes)`, in memory order) fill `dst`, repacked
/// when `repack` says how.
pub(super) struct Job<'a> {
    pub dst: &'a mut [u8],
    pub pieces: Vec<(usize, u64, usize)>,
    pub repack: Option<&'a ExpertRepack>,
}

/// What a job cost: seconds reading, bytes read, and seconds repacking (`None`: not repacked).
pub(super) struct Done {
    pub read_s: f64,
    pub bytes: usize,
    pub repack_s: Option<f64>,
}

/// Reads `pieces` into `dst` on `lane`: straight into it in the file's layout, or through the
/// thread's scratch and `repack` into it.
pub(super) fn read_into(
    reader: &DirectReader,
    lane: usize,
    pieces: &[(usize, u64, usize)],
    dst: &mut [u8],
    repack: Option<&ExpertRepack>,
) -> std::io::Result<Done> {
    let bytes = dst.len();
    let Some(rp) = repack else {
        let mut read_s = 0.0;
        let mut at = 0;
        for &(file, off, len) in pieces {
            read_s += reader.read(lane, file, off, &mut dst[at..at + len])?;
            at += len;
        }
        return Ok(Done {
            read_s,
            bytes,
            repack_s: None,
        });
    };
    // One piece (an expert's slice is contiguous in the file): repacked straight from where the
    // read landed, without a copy through the scratch.
    if let [(file, off, len)] = *pieces {
        let (repacked, read_s) = reader.read_with(lane, file, off, len, |got| {
            let t0 = Instant::now();
            rp.repack(got, dst).map(|()| t0.elapsed().as_secs_f64())
        })?;
        return Ok(Done {
            read_s,
            bytes,
            repack_s: Some(repacked.map_err(std::io::Error::other)?),
        });
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.resize(bytes, 0);
        let mut read_s = 0.0;
        let mut at = 0;
        for &(file, off, len) in pieces {
            read_s += reader.read(lane, file, off, &mut s[at..at + len])?;
            at += len;
        }
        let t0 = Instant::now();
        rp.repack(&s, dst).map_err(std::io::Error::other)?;
        Ok(Done {
            read_s,
            bytes,
            repack_s: Some(t0.elapsed().as_secs_f64()),
        })
    })
}

/// Whether `jobs` can run [`run_pipelined`]: two or more, each one piece, repacked.
pub(super) fn pipelines(jobs: &[Job<'_>]) -> bool {
    jobs.len() >= 2
        && jobs
            .iter()
            .all(|j| j.pieces.len() == 1 && j.repack.is_some())
}

/// A job read into a buffer of the pipeline: where its bytes are there, and the read's seconds.
type Read<'j, 'b> = (Job<'j>, std::ops::Range<usize>, f64, &'b mut Region);

/// Runs `jobs` ([`pipelines`]) on `lane` in two stages: the calling thread reads each into one
/// of `bufs` (from [`DirectReader::bounce`]) while `repacker`'s thread repacks the one before
/// out of another into its slot. A decode node's repacks then hide behind its reads, and reads
/// still go one at a time, which this storage serves best (two in flight ran barely faster than
/// one). Results in no particular order; a job left unread is an error.
pub(super) fn run_pipelined(
    reader: &DirectReader,
    lane: usize,
    jobs: Vec<Job<'_>>,
    bufs: &mut [Region],
    repacker: &rayon::ThreadPool,
) -> Vec<std::io::Result<Done>> {
    let (free_tx, free_rx) = channel();
    let (read_tx, read_rx) = channel();
    let (done_tx, done_rx) = channel();
    for b in bufs.iter_mut() {
        let _ = free_tx.send(b);
    }
    repacker.in_place_scope(|s| {
        // The repacking stage holds the only sender of free buffers: if it stops, the reading
        // stage's wait for one ends instead of hanging.
        s.spawn(move |_| {
            let _ = done_tx.send(repack_stage(read_rx, free_tx));
        });
        let mut results = read_stage(reader, lane, jobs, free_rx, read_tx);
        match done_rx.recv() {
            Ok(mut done) => results.append(&mut done),
            Err(_) => results.push(Err(std::io::Error::other("the repacking thread stopped"))),
        }
        results
    })
}

/// The reading stage: each job read into the next free buffer and passed on (`read`); returns
/// the errors.
fn read_stage<'j, 'b>(
    reader: &DirectReader,
    lane: usize,
    jobs: Vec<Job<'j>>,
    free: Receiver<&'b mut Region>,
    read: Sender<Read<'j, 'b>>,
) -> Vec<std::io::Result<Done>> {
    let mut errors = Vec::new();
    // A buffer whose read failed is reused here, not handed back.
    let mut spare = None;
    for job in jobs {
        let Some(buf) = spare.take().or_else(|| free.recv().ok()) else {
            errors.push(Err(std::io::Error::other("the repacking thread stopped")));
            break;
        };
        let (file, off, len) = job.pieces[0];
        match reader.read_aligned(lane, file, off, len, buf) {
            Ok((at, read_s)) => {
                if read.send((job, at, read_s, buf)).is_err() {
                    errors.push(Err(std::io::Error::other("the repacking thread stopped")));
                    break;
                }
            }
            Err(e) => {
                errors.push(Err(e));
                spare = Some(buf);
            }
        }
    }
    errors
}

/// The repacking stage: each job repacked out of its buffer into its slot, the buffer handed
/// back (`free`).
fn repack_stage<'j, 'b>(
    read: Receiver<Read<'j, 'b>>,
    free: Sender<&'b mut Region>,
) -> Vec<std::io::Result<Done>> {
    let mut done = Vec::new();
    for (job, at, read_s, buf) in read {
        let t0 = Instant::now();
        let r = match job.repack {
            Some(rp) => rp.repack(&buf.as_slice()[at], job.dst),
            None => Err(crate::ffi::error::FfiError::Argument(
                "a job without a repack".into(),
            )),
        };
        done.push(r.map_err(std::io::Error::other).map(|()| Done {
            read_s,
            bytes: job.dst.len(),
            repack_s: Some(t0.elapsed().as_secs_f64()),
        }));
        let _ = free.send(buf);
    }
    done
}

impl Job<'_> {
    /// Runs the job on `lane`.
    pub(super) fn run(self, reader: &DirectReader, lane: usize) -> std::io::Result<Done> {
        read_into(reader, lane, &self.pieces, self.dst, self.repack)
    }
}

/// Tags every expert matrix of `tensors` for the CPU's repacked kernels where ggml chooses one
/// (`CpuRepack::tag`): per matrix, how its experts are repacked (`None`: the file's layout).
pub(super) fn tag_all(
    cpu: &CpuRepack,
    tensors: &[ExpertMatrix],
    quiet: &mut Quiet<'_>,
) -> Vec<Option<ExpertRepack>> {
    tensors.iter().map(|t| cpu.tag(t.tensor, quiet)).collect()
}

/// Repacks the 2-D weight `w`, bound to its copy in `region` (`dense_weights = anon`), in place
/// where ggml chooses a repack for it (tagged as for the experts: a 2-D matrix is one "expert");
/// `false` where it stays in the file's layout.
pub(super) fn repack_copy(
    cpu: &CpuRepack,
    w: TensorPtr,
    region: &mut Region,
    quiet: &mut Quiet<'_>,
) -> Result<bool> {
    let ne = w.ne();
    if ne[2] != 1 || ne[3] != 1 {
        return Ok(false);
    }
    let n = w.nbytes();
    // The repack reads rows after writing earlier ones: from a copy of the file's bytes.
    let plain = region.as_slice()[..n].to_vec();
    let Some(rp) = cpu.tag(w, quiet) else {
        return Ok(false);
    };
    rp.repack(&plain, &mut region.as_mut_slice()[..n])
        .map_err(EngineError::Weight)?;
    Ok(true)
}

/// The dense matmul weights (neither experts nor in `capture.non_matmul`) the resident load puts
/// in the AMX layout, converted into engine memory of that layout's size and bound there, from
/// the file's mapping or from their `anon` copy, which the converted one replaces in `dense`.
/// `None` where this CPU variant has no AMX; else the marker (to keep while they compute) and the
/// weights converted.
pub(super) fn amx_dense(
    capture: &Capture,
    layers: &BTreeMap<u32, Layer>,
    dense: &mut Vec<(TensorPtr, Region)>,
    quiet: &mut Quiet<'_>,
) -> Result<Option<(DenseAmx, Vec<TensorPtr>)>> {
    let Some(amx) = DenseAmx::new() else {
        return Ok(None);
    };
    let experts = super::layers::expert_tensors(layers);
    let mut done = Vec::new();
    for w in capture.weights.values() {
        if experts.contains(w) || capture.non_matmul.contains(&w.name()) {
            continue;
        }
        let Some(bytes) = amx.takes(*w) else {
            continue;
        };
        let plain = w
            .bytes(quiet)
            .ok_or_else(|| {
                EngineError::Weight(FfiError::Argument(format!(
                    "{}: not in host memory",
                    w.name()
                )))
            })?
            .to_vec();
        let mut r = Region::reserve(bytes).map_err(|e| {
            EngineError::Weight(FfiError::Argument(format!(
                "{}: reserving {bytes} bytes for the AMX layout: {e}",
                w.name()
            )))
        })?;
        amx.convert(*w, &plain, &mut r, quiet)
            .map_err(EngineError::Weight)?;
        match dense.iter_mut().find(|(t, _)| t == w) {
            Some(copy) => copy.1 = r,
            None => dense.push((*w, r)),
        }
        done.push(*w);
    }
    Ok(Some((amx, done)))
}
