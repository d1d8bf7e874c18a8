//! The arena's loaders (`prefill_loaders`): threads that fill a slot while the device computes out
//! of the other one. Each job puts one tensor, or a run of experts of one, into device memory: a
//! copy from host memory, or an O_DIRECT read from the GGUF handed over through a view of the run.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::DeviceError;
use crate::ffi::tensor::{Binding, TensorPtr, ViewScratch};
use crate::io::Lanes;

/// What a wait is for: a layer's non-expert weights, or its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ticket {
    /// Everything of layer `il` needed before its routing node.
    Dense(u32),
    /// The experts of layer `il`.
    Experts(u32),
}

/// Where a job's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Host memory: the tensor's host binding, from this byte offset.
    Host(Binding, usize),
    /// Bytes the arena owns (a weight converted at load for the device).
    Owned(Arc<Vec<u8>>),
    /// The GGUF: one expert's pieces (file, absolute offset, bytes), read one after another.
    File(Vec<(usize, u64, usize)>),
}

/// Where a job's bytes go.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// The whole tensor.
    Whole(TensorPtr),
    /// Experts `first..first + count` of a 3-D expert tensor, which lie one after another in it.
    Experts {
        /// The expert tensor.
        t: TensorPtr,
        /// The first expert written.
        first: usize,
        /// How many experts, from `first` on.
        count: usize,
    },
}

/// One upload.
#[derive(Debug, Clone)]
pub struct Job {
    /// The wait it belongs to.
    pub ticket: Ticket,
    /// Destination.
    pub target: Target,
    /// Source.
    pub source: Source,
    /// Bytes.
    pub len: usize,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    pending: HashMap<Ticket, usize>,
    in_flight: usize,
    error: Option<DeviceError>,
    bytes: u64,
    file_bytes: u64,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A loader never panics while holding the lock (jobs run outside it).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The loader pool of one arena.
pub struct Loaders {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Loaders {
    /// Starts `n` loaders; `reader` serves `Source::File` jobs; `delay` slows every job (a gate
    /// knob: a slow loader must not change any result).
    pub fn start(
        n: usize,
        reader: Option<Lanes>,
        max_read: usize,
        delay: Duration,
        cpus: &[usize],
    ) -> Result<Self, DeviceError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let mut threads = Vec::new();
        for lane in 0..n.max(1) {
            let shared = shared.clone();
            let reader = reader.clone();
            let scratch = ViewScratch::new()?;
            let cpus = cpus.to_vec();
            let h = std::thread::Builder::new()
                .name(format!("bmoe-load-{lane}"))
                .spawn(move || {
                    // A failed pin leaves the loader where the kernel put it: slower, never wrong.
                    let _ = crate::ffi::affinity::pin_current_thread(&cpus);
                    worker(&shared, reader.as_ref(), lane, max_read, scratch, delay)
                })
                .map_err(|e| DeviceError::io("starting arena loaders", e))?;
            threads.push(h);
        }
        Ok(Self { shared, threads })
    }

    /// Queues jobs behind those already queued.
    pub fn push_back(&self, jobs: impl IntoIterator<Item = Job>) {
        self.push(jobs, false)
    }

    /// Queues jobs ahead of everything queued (what the routing node found missing).
    pub fn push_front(&self, jobs: impl IntoIterator<Item = Job>) {
        self.push(jobs, true)
    }

    fn push(&self, jobs: impl IntoIterator<Item = Job>, front: bool) {
        let mut s = self.shared.lock();
        let mut n = 0;
        for (i, j) in jobs.into_iter().enumerate() {
            *s.pending.entry(j.ticket).or_default() += 1;
            if front {
                s.jobs.insert(i, j);
            } else {
                s.jobs.push_back(j);
            }
            n += 1;
        }
        if n > 0 {
            self.shared.work.notify_all();
        }
    }

    /// Blocks until every job of `ticket` is done; a failed job fails the wait.
    pub fn wait(&self, ticket: Ticket) -> Result<(), DeviceError> {
        let mut s = self.shared.lock();
        loop {
            if let Some(e) = &s.error {
                return Err(e.clone());
            }
            if !s.pending.contains_key(&ticket) {
                return Ok(());
            }
            s = self.shared.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Drops queued jobs and waits for those running, so nothing writes a slot afterwards;
    /// returns and clears the first error.
    pub fn drain(&self) -> Option<DeviceError> {
        let mut s = self.shared.lock();
        s.jobs.clear();
        s.pending.clear();
        while s.in_flight > 0 {
            s = self.shared.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.pending.clear();
        s.error.take()
    }

    /// Bytes uploaded so far.
    pub fn bytes(&self) -> u64 {
        self.shared.lock().bytes
    }

    /// Bytes of those read from the GGUF.
    pub fn file_bytes(&self) -> u64 {
        self.shared.lock().file_bytes
    }
}

impl Drop for Loaders {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(
    shared: &Shared,
    reader: Option<&Lanes>,
    lane: usize,
    max_read: usize,
    mut scratch: ViewScratch,
    delay: Duration,
) {
    let mut buf = Vec::new();
    loop {
        let job = {
            let mut s = shared.lock();
            loop {
                if s.stop {
                    return;
                }
                if let Some(j) = s.jobs.pop_front() {
                    s.in_flight += 1;
                    break j;
                }
                s = shared.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let r = run(&job, reader, lane, max_read, &mut scratch, &mut buf);
        let mut s = shared.lock();
        s.in_flight -= 1;
        match r {
            Ok(()) => {
                s.bytes += job.len as u64;
                if matches!(job.source, Source::File(_)) {
                    s.file_bytes += job.len as u64;
                }
            }
            Err(e) => {
                s.error.get_or_insert(e);
            }
        }
        if let Some(p) = s.pending.get_mut(&job.ticket) {
            *p -= 1;
            if *p == 0 {
                s.pending.remove(&job.ticket);
            }
        }
        shared.done.notify_all();
    }
}

fn run(
    job: &Job,
    reader: Option<&Lanes>,
    lane: usize,
    max_read: usize,
    scratch: &mut ViewScratch,
    buf: &mut Vec<u8>,
) -> Result<(), DeviceError> {
    let src: &[u8] = match &job.source {
        Source::Host(b, off) => {
            let off = *off;
            b.host_bytes()
                .and_then(|all| all.get(off..off + job.len))
                .ok_or_else(|| DeviceError::NotOnHost("a weight's host copy".into()))?
        }
        Source::Owned(b) => b.as_slice(),
        Source::File(parts) => {
            let reader =
                reader.ok_or_else(|| DeviceError::Job("no reader for an expert read".into()))?;
            if job.len > max_read || parts.iter().map(|p| p.2).sum::<usize>() != job.len {
                return Err(DeviceError::Job(format!(
                    "expert read of {} bytes is over the limit or not its pieces' sum",
                    job.len
                )));
            }
            buf.resize(job.len, 0);
            let mut at = 0;
            for &(file, offset, len) in parts {
                reader
                    .reader()
                    .read(reader.lane(lane), file, offset, &mut buf[at..at + len])
                    .map_err(|e| DeviceError::io("reading experts for the device", e))?;
                at += len;
            }
            buf
        }
    };
    match job.target {
        Target::Whole(t) => Ok(t.upload(src)?),
        Target::Experts { t, first, count } => Ok(scratch.upload_experts(t, first, count, src)?),
    }
}
