//! The direct reader: positioned O_DIRECT reads through aligned bounce buffers, one descriptor per
//! lane and file, with an open-time check that a direct read equals a buffered one.
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use crate::ffi::region::Region;

/// O_DIRECT offsets, lengths and buffers are aligned to this (covers 512 B and 4 KiB sectors).
const ALIGN: u64 = 4096;

struct Lane {
    files: Vec<File>,
    bounce: Region,
}

/// Reads byte ranges of a set of files, from `lanes` threads at once.
pub struct DirectReader {
    paths: Vec<PathBuf>,
    lanes: Vec<Mutex<Lane>>,
    direct: Vec<bool>,
    max_read: usize,
}

fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Reads `len` bytes at `offset` of `f` into the aligned `bounce` buffer and returns them there.
fn read_direct<'b>(
    f: &File,
    bounce: &'b mut Region,
    offset: u64,
    len: usize,
) -> std::io::Result<&'b [u8]> {
    let start = offset - offset % ALIGN;
    let end = (offset + len as u64).next_multiple_of(ALIGN);
    let buf = &mut bounce.as_mut_slice()[..(end - start) as usize];
    let mut got = 0usize;
    // Short reads happen at end of file (the aligned range may pass it) and are retried elsewhere.
    while (got as u64) < offset - start + len as u64 {
        let n = f.read_at(&mut buf[got..], start + got as u64)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("short read: wanted {len} bytes at {offset}, the file ended"),
            ));
        }
        got += n;
    }
    let from = (offset - start) as usize;
    Ok(&buf[from..from + len])
}

impl DirectReader {
    /// Opens every file once per lane; `max_read` is the largest single read asked for later.
    pub fn open(paths: &[PathBuf], lanes: usize, max_read: usize) -> std::io::Result<Self> {
        let lanes = lanes.max(1);
        let bounce_len = max_read + 2 * ALIGN as usize;
        // Which files O_DIRECT works on, and gives the same bytes as the page cache.
        let mut direct = Vec::with_capacity(paths.len());
        for p in paths {
            direct.push(Self::verify_direct(p)?);
        }
        let mut v = Vec::with_capacity(lanes);
        for _ in 0..lanes {
            let files = paths
                .iter()
                .zip(&direct)
                .map(|(p, &d)| open(p, d))
                .collect::<std::io::Result<Vec<_>>>()?;
            v.push(Mutex::new(Lane {
                files,
                bounce: Region::reserve(bounce_len)?,
            }));
        }
        Ok(Self {
            paths: paths.to_vec(),
            lanes: v,
            direct,
            max_read,
        })
    }

    /// True when O_DIRECT opens, reads, and returns what a buffered read returns.
    fn verify_direct(path: &Path) -> std::io::Result<bool> {
        let Ok(f) = open(path, true) else {
            return Ok(false);
        };
        let buffered = open(path, false)?;
        let len = buffered.metadata()?.len();
        // An unaligned range near the start and the file's unaligned tail.
        let probes = [(ALIGN / 2 + 3).min(len), len.saturating_sub(1000)];
        let mut bounce = Region::reserve(64 * 1024)?;
        for off in probes {
            let n = (len - off).min(8 * 1024) as usize;
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            match read_direct(&f, &mut bounce, off, n) {
                Ok(got) => a.copy_from_slice(got),
                Err(_) => return Ok(false),
            }
            buffered.read_exact_at(&mut b, off)?;
            if a != b {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Lanes.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The largest single read the bounce buffers hold.
    pub fn max_read(&self) -> usize {
        self.max_read
    }

    /// Whether each file is read with O_DIRECT (false = buffered fallback).
    pub fn direct(&self) -> &[bool] {
        &self.direct
    }

    /// Reads `dst.len()` bytes at `offset` of file `file` on lane `lane`; returns seconds spent.
    pub fn read(
        &self,
        lane: usize,
        file: usize,
        offset: u64,
        dst: &mut [u8],
    ) -> std::io::Result<f64> {
        self.read_with(lane, file, offset, dst.len(), |got| {
            dst.copy_from_slice(got)
        })
        .map(|((), s)| s)
    }

    /// A buffer [`DirectReader::read_aligned`] can read any single read of this reader into.
    pub fn bounce(&self) -> std::io::Result<Region> {
        Region::reserve(self.max_read + 2 * ALIGN as usize)
    }

    /// Reads `len` bytes at `offset` of file `file` with lane `lane`'s descriptor into `buf` (one
    /// from [`DirectReader::bounce`]), not the lane's own bounce buffer: the bytes stay there for
    /// another thread to use while the lane reads the next ones. Returns where in `buf` they are
    /// and the seconds spent reading.
    pub fn read_aligned(
        &self,
        lane: usize,
        file: usize,
        offset: u64,
        len: usize,
        buf: &mut Region,
    ) -> std::io::Result<(std::ops::Range<usize>, f64)> {
        let t0 = Instant::now();
        let l = self.lanes[lane % self.lanes.len()]
            .lock()
            .map_err(|_| std::io::Error::other("a reader lane panicked"))?;
        let f = &l.files[file];
        if len > self.max_read || buf.len() < self.max_read + 2 * ALIGN as usize {
            return Err(std::io::Error::other("read larger than the bounce buffer"));
        }
        let r = if self.direct[file] {
            read_direct(f, buf, offset, len).map(|_| (offset % ALIGN) as usize)
        } else {
            f.read_exact_at(&mut buf.as_mut_slice()[..len], offset)
                .map(|()| 0)
        };
        let at = r.map_err(|e| self.read_error(file, offset, len, e))?;
        Ok((at..at + len, t0.elapsed().as_secs_f64()))
    }

    /// The error of a failed read: the file, the range and the OS error (its errno in the text),
    /// what a fleet's storage failure report needs to find the bad block.
    fn read_error(
        &self,
        file: usize,
        offset: u64,
        len: usize,
        e: std::io::Error,
    ) -> std::io::Error {
        std::io::Error::new(
            e.kind(),
            format!(
                "{}: reading {len} bytes at offset {offset}{}: {e}",
                self.paths[file].display(),
                if self.direct[file] { " (O_DIRECT)" } else { "" },
            ),
        )
    }

    /// Reads `len` bytes at `offset` of file `file` on lane `lane` and hands them to `use_bytes`
    /// where they landed (the lane's bounce buffer, for O_DIRECT): a caller that transforms the
    /// bytes anyway (a repack) saves the copy out. Returns what `use_bytes` returned and the
    /// seconds spent reading, not using.
    pub fn read_with<R>(
        &self,
        lane: usize,
        file: usize,
        offset: u64,
        len: usize,
        use_bytes: impl FnOnce(&[u8]) -> R,
    ) -> std::io::Result<(R, f64)> {
        let t0 = Instant::now();
        let mut l = self.lanes[lane % self.lanes.len()]
            .lock()
            .map_err(|_| std::io::Error::other("a reader lane panicked"))?;
        let Lane { files, bounce } = &mut *l;
        let f = &files[file];
        let mut buffered = Vec::new();
        let r = if self.direct[file] {
            if len > self.max_read {
                return Err(std::io::Error::other("read larger than the bounce buffer"));
            }
            read_direct(f, bounce, offset, len)
        } else {
            buffered.resize(len, 0);
            f.read_exact_at(&mut buffered, offset)
                .map(|()| &buffered[..])
        };
        let got = r.map_err(|e| self.read_error(file, offset, len, e))?;
        let read_s = t0.elapsed().as_secs_f64();
        Ok((use_bytes(got), read_s))
    }
}

/// A contiguous share of a model's one [`DirectReader`]: lane `i` here is lane `base + i` there, so
/// the streamer and the arena's loaders read through the same descriptors without queueing on
/// each other's lanes.
#[derive(Clone)]
pub struct Lanes {
    reader: std::sync::Arc<DirectReader>,
    base: usize,
}

impl Lanes {
    /// Lanes `base..` of `reader`.
    pub fn new(reader: std::sync::Arc<DirectReader>, base: usize) -> Self {
        Self { reader, base }
    }

    /// The shared reader.
    pub fn reader(&self) -> &DirectReader {
        &self.reader
    }

    /// The reader's lane for this share's lane `i`.
    pub fn lane(&self, i: usize) -> usize {
        self.base + i
    }
}

/// MiB/s of random reads of `read_bytes` at multiples of it within the first `size` bytes of the
/// reader's first file, with `depth` reads in flight (one thread per lane, `depth` at most the
/// reader's lanes) for `spend`. Each lane walks a fixed-seed LCG of its own, so the offsets differ
/// between lanes and are the same on every run. A read that fails ends its lane; `Err` when none
/// completed.
pub fn random_read_rate(
    reader: &std::sync::Arc<DirectReader>,
    read_bytes: usize,
    size: u64,
    depth: usize,
    spend: std::time::Duration,
) -> std::io::Result<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let first_err = std::sync::Arc::new(Mutex::new(None));
    let slots = (size / read_bytes.max(1) as u64).max(1);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..depth.clamp(1, reader.lanes()))
        .map(|lane| {
            let (reader, stop, done) = (reader.clone(), stop.clone(), done.clone());
            let first_err = first_err.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; read_bytes];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ lane as u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 33) % slots * read_bytes as u64;
                    if let Err(e) = reader.read(lane, 0, off, &mut buf) {
                        first_err
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        break;
                    }
                    done.fetch_add(read_bytes as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(spend);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let bytes = done.load(Ordering::Relaxed);
    if bytes == 0 {
        let e = first_err.lock().unwrap_or_else(|p| p.into_inner()).take();
        return Err(e.unwrap_or_else(|| std::io::Error::other("no read completed")));
    }
    Ok(bytes as f64 / (1u64 << 20) as f64 / t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_reads_match_the_file_including_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let data: Vec<u8> = (0..20_011u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let r = DirectReader::open(&[p], 2, 9000).unwrap();
        for (off, n) in [
            (0usize, 10usize),
            (33, 4096),
            (4095, 2),
            (12_000, 8011),
            (20_000, 11),
        ] {
            let mut dst = vec![0u8; n];
            r.read(off % 2, 0, off as u64, &mut dst).unwrap();
            assert_eq!(dst, &data[off..off + n], "offset {off}");
        }
        let mut past = vec![0u8; 20];
        assert!(
            r.read(0, 0, 20_000, &mut past).is_err(),
            "a read past the end must fail"
        );
    }
}
