//! `disk_probe`: the storage's random-read rate, measured before a point loads, so a streamed
//! point's decode can be put against its floor with the rate of its own sitting.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bmoe_engine::io::{random_read_rate, DirectReader};
use bmoe_engine::plan::ModelDims;

/// How long the probe reads: at the 0.8-2.5 GiB/s of this project's VMs, 1.6-5 GiB in reads of
/// an expert matrix, thousands of them, so the rate's own spread is small beside the sitting's.
const SPEND: Duration = Duration::from_secs(2);

/// The read size where the model has no routed experts: the bench preset's expert matrix.
const DENSE_READ: u64 = 576 << 10;

/// Matrices per expert (gate, up and down) the read size is the mean of.
const MATRICES: u64 = 3;

/// MiB/s of random O_DIRECT reads of `model` (its first file), one expert matrix's mean size
/// each, `lanes` in flight.
pub(super) fn disk_rate(model: &Path, lanes: usize) -> Result<f64, String> {
    let dims = ModelDims::read(model).map_err(|e| e.to_string())?;
    let read = read_size(&dims);
    let size = std::fs::metadata(model).map_err(|e| e.to_string())?.len();
    if size < read {
        return Err(format!("the file is smaller than one read of {read} bytes"));
    }
    let reader = DirectReader::open(&[model.to_path_buf()], lanes, read as usize)
        .map_err(|e| format!("opening it for O_DIRECT reads: {e}"))?;
    if !reader.direct().first().copied().unwrap_or(false) {
        return Err("its file system refuses O_DIRECT: the page cache would be measured".into());
    }
    random_read_rate(&Arc::new(reader), read as usize, size, lanes, SPEND)
        .map_err(|e| format!("reading it: {e}"))
}

/// One expert matrix's mean size: the largest layer's routed expert bytes over its experts and
/// their three matrices, rounded up to whole 4 KiB pages as an aligned read of it is.
fn read_size(dims: &ModelDims) -> u64 {
    if dims.n_expert == 0 || dims.max_layer_expert_bytes == 0 {
        return DENSE_READ;
    }
    (dims.max_layer_expert_bytes / (dims.n_expert * MATRICES)).div_ceil(4096) * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_presets_matrix_is_read_whole() {
        // 160 experts of three 1024 x 1024 Q4_0 matrices (576 KiB each).
        let dims = ModelDims {
            n_expert: 160,
            max_layer_expert_bytes: 160 * 3 * (576 << 10),
            ..ModelDims::default()
        };
        assert_eq!(read_size(&dims), 576 << 10);
        let odd = ModelDims {
            n_expert: 2,
            max_layer_expert_bytes: 6 * 5000,
            ..ModelDims::default()
        };
        assert_eq!(read_size(&odd), 8192);
        assert_eq!(read_size(&ModelDims::default()), DENSE_READ);
    }
}
