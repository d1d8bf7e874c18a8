//! Reader threads that sleep while idle. A rayon pool's idle threads spin and yield for a while
//! after each job, and on a machine with as many cores as compute threads every yield takes a turn
//! on a core a compute thread needs: one compute thread stalls and the other waits for it at the
//! next barrier. These threads block on a condition variable instead, and each owns one lane (its
//! index), which picks its bounce buffer in the reader.
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce(usize) + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Shared {
    // A job that panicked ran outside the lock, so the queue itself is never half-updated.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A fixed set of threads running queued jobs, each job given the lane of the thread that runs it.
pub(crate) struct ReadThreads {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl ReadThreads {
    /// Starts `n` threads (at least one), named `<name>-<lane>`, each on `cpus` (empty = anywhere).
    pub(crate) fn new(n: usize, name: &str, cpus: &[usize]) -> std::io::Result<ReadThreads> {
        let shared = Arc::new(Shared::default());
        let mut pool = ReadThreads {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for lane in 0..n.max(1) {
            let shared = shared.clone();
            let cpus = cpus.to_vec();
            // On an error `pool` is dropped, which stops the threads already started.
            pool.threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{lane}"))
                    .spawn(move || {
                        // A failed pin leaves the thread where the kernel put it: slower, never wrong.
                        let _ = crate::ffi::affinity::pin_current_thread(&cpus);
                        run(&shared, lane)
                    })?,
            );
        }
        Ok(pool)
    }

    /// Queues `job`; the next idle thread runs it with its lane.
    pub(crate) fn spawn(&self, job: impl FnOnce(usize) + Send + 'static) {
        self.shared.lock().jobs.push_back(Box::new(job));
        self.shared.ready.notify_one();
    }
}

fn run(shared: &Shared, lane: usize) {
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.closed {
                    return;
                }
                q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        job(lane);
    }
}

impl Drop for ReadThreads {
    /// Runs what is queued, then stops and joins the threads.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReadThreads;
    use std::sync::mpsc::channel;

    #[test]
    fn every_job_runs_once_on_a_lane_of_the_pool() {
        let (tx, rx) = channel();
        {
            let pool = ReadThreads::new(3, "test-read", &[]).unwrap();
            for i in 0..100 {
                let tx = tx.clone();
                pool.spawn(move |lane| tx.send((i, lane)).unwrap());
            }
        }
        // Dropping the pool ran everything queued.
        drop(tx);
        let mut got: Vec<(i32, usize)> = rx.iter().collect();
        got.sort();
        assert_eq!(got.len(), 100);
        assert!(got.iter().enumerate().all(|(i, &(j, _))| i as i32 == j));
        assert!(got.iter().all(|&(_, lane)| lane < 3));
    }
}
