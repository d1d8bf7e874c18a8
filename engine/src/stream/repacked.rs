//! Reading an expert into its slot, in the file's layout or in the CPU's repacked one
//! (`repack = auto`): a repacked expert is repacked from where its read landed (the lane's bounce
//! buffer; an expert in several pieces is gathered in the reading thread's scratch first) into
//! the slot, on the same thread (a reader lane, or the thread that
//! reads a decode-sized node's few misses inline), never on the compute threads' kernels.
use std::cell::RefCell;
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::ffi::region::Region;
use crate::ffi::repack::{CpuRepack, ExpertRepack};
use crate::ffi::tensor::TensorPtr;
use crate::io::DirectReader;
use crate::weights::table::ExpertMatrix;
use crate::weights::Quiet;

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
