//! The expert cache under memory pressure (`cache_reserve_mb`). A phone's low-memory killer ends
//! the process that holds memory another app needs, and a cache sized at load can only keep
//! everything or lose everything. So at routing nodes, at most every [`POLL`], the streamer
//! samples the memory left to it (`memory::available_bytes`: the smaller of `MemAvailable` and
//! the cgroup's headroom) and the kernel's memory stall time (PSI), and moves the cache's budget
//! between `cache_min_mb` and its configured size; evictions then give the pages back. What the
//! cache holds never changes a result, only how much is read.
use std::time::{Duration, Instant};

use super::memory;

/// How often memory is sampled: each sample reads a few /proc and cgroup files (tens of
/// microseconds), and an app taking memory at a few hundred MiB/s is met within one step.
const POLL: Duration = Duration::from_millis(100);
/// Share of wall time some task stalled on memory (PSI `some`) that counts as pressure.
const STALL_SHARE: f64 = 0.10;
/// Calm (available memory at least twice the reserve, no stalls) this long before the budget
/// grows back: an app that frees memory for a moment does not make the cache refill at once.
const CALM: Duration = Duration::from_secs(1);

/// One sample of the system's memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// Bytes this process could still use without being reclaimed or killed.
    pub available: u64,
    /// PSI memory `some` total in microseconds; `None` where the kernel has no PSI.
    pub stall_us: Option<u64>,
}

impl Sample {
    /// Reads the system's memory now.
    fn now() -> Self {
        Self {
            available: memory::available_bytes(),
            stall_us: psi_some_total(),
        }
    }
}

/// `total=` of the `some` line of `/proc/pressure/memory`.
fn psi_some_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/pressure/memory").ok()?;
    let line = s.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// A change of the cache's budget (bytes), logged once and counted.
#[derive(Debug, Clone, PartialEq)]
pub enum Resize {
    /// Memory ran short: the budget fell.
    Shrink {
        /// Budget before.
        from: u64,
        /// Budget now.
        to: u64,
        /// Memory available at the sample.
        available: u64,
        /// The reserve it fell under (or that tasks stalled on memory).
        reserve: u64,
        /// Tasks stalled on memory for more than [`STALL_SHARE`] of the last interval.
        stalled: bool,
    },
    /// The pressure eased: the budget rose.
    Grow {
        /// Budget before.
        from: u64,
        /// Budget now.
        to: u64,
        /// Memory available at the sample.
        available: u64,
    },
}

/// MiB, rounded down, for messages.
fn mib(b: u64) -> u64 {
    b >> 20
}

impl std::fmt::Display for Resize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Resize::Shrink {
                from,
                to,
                available,
                reserve,
                stalled,
            } => {
                let why = if available < reserve {
                    format!(
                        "{} MiB available, under the {} MiB cache_reserve_mb",
                        mib(available),
                        mib(reserve)
                    )
                } else {
                    debug_assert!(stalled);
                    format!("tasks stalled on memory over {:.0}% of the time", STALL_SHARE * 100.0)
                };
                write!(
                    f,
                    "memory pressure ({why}): the expert cache shrinks from {} to {} MiB",
                    mib(from),
                    mib(to)
                )
            }
            Resize::Grow {
                from,
                to,
                available,
            } => write!(
                f,
                "memory pressure eased ({} MiB available): the expert cache may grow back from {} to {} MiB",
                mib(available),
                mib(from),
                mib(to)
            ),
        }
    }
}

/// The cache's budget as memory pressure moves it between its bounds.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The configured size.
    max: u64,
    /// The size it never shrinks below.
    min: u64,
    /// Memory kept free for everything else.
    reserve: u64,
    /// The budget now.
    budget: u64,
    /// The last sample's time and stall total.
    last: Option<(Instant, Option<u64>)>,
    /// Since when memory has been calm.
    calm_since: Option<Instant>,
}

impl Watch {
    /// A watch over a cache of `max` bytes that keeps `reserve` bytes free, down to `min` bytes.
    pub(crate) fn new(max: u64, min: u64, reserve: u64) -> Self {
        Self {
            max,
            min: min.min(max),
            reserve,
            budget: max,
            last: None,
            calm_since: None,
        }
    }

    /// The budget now.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// Samples memory when [`POLL`] has passed since the last sample; `resident` is what the
    /// cache holds now.
    pub(crate) fn poll(&mut self, now: Instant, resident: u64) -> Option<Resize> {
        if matches!(self.last, Some((t, _)) if now.duration_since(t) < POLL) {
            return None;
        }
        self.observe(now, Sample::now(), resident)
    }

    /// Moves the budget for one sample: down when available memory is under the reserve or
    /// tasks stall on memory, back up after [`CALM`] with at least twice the reserve available
    /// (between the two it holds, so one app's small moves do not make it swing).
    pub(crate) fn observe(&mut self, now: Instant, s: Sample, resident: u64) -> Option<Resize> {
        let stalled = match (self.last, s.stall_us) {
            (Some((t, Some(before))), Some(total)) => {
                let dt = now.duration_since(t).as_micros() as f64;
                dt > 0.0 && total.saturating_sub(before) as f64 / dt > STALL_SHARE
            }
            _ => false,
        };
        self.last = Some((now, s.stall_us));
        if s.available < self.reserve || stalled {
            self.calm_since = None;
            return self.shrink(s.available, stalled, resident);
        }
        if s.available < self.reserve.saturating_mul(2) {
            self.calm_since = None;
            return None;
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.duration_since(since) < CALM {
            return None;
        }
        // From what the cache holds, not from the budget: a budget raised at the last sample is
        // not filled yet, and adding the same free memory to it again would overshoot.
        let to = self
            .max
            .min(resident + (s.available - 2 * self.reserve))
            .max(self.min);
        (to > self.budget).then(|| {
            let from = std::mem::replace(&mut self.budget, to);
            Resize::Grow {
                from,
                to,
                available: s.available,
            }
        })
    }

    /// Lowers the budget below what the cache holds by what the reserve lacks and a quarter of
    /// the reserve more (so the next sample does not find it short again), or by an eighth of
    /// the configured size when only stalls say memory is short.
    fn shrink(&mut self, available: u64, stalled: bool, resident: u64) -> Option<Resize> {
        let lacking = self.reserve.saturating_sub(available);
        let step = if lacking > 0 {
            lacking + self.reserve / 4
        } else {
            self.max / 8
        };
        let to = resident.min(self.budget).saturating_sub(step).max(self.min);
        (to < self.budget).then(|| {
            let from = std::mem::replace(&mut self.budget, to);
            Resize::Shrink {
                from,
                to,
                available,
                reserve: self.reserve,
                stalled,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sample(available_mib: u64, stall_us: u64) -> Sample {
        Sample {
            available: available_mib * MIB,
            stall_us: Some(stall_us),
        }
    }

    #[test]
    fn short_memory_shrinks_below_what_is_held_then_calm_grows_it_back() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Watch::new(100 * MIB, 10 * MIB, 40 * MIB);
        assert_eq!(w.observe(at(0), sample(200, 0), 90 * MIB), None);
        // 30 MiB available, 10 short of the reserve: 90 held - (10 + 10) = 70.
        let r = w.observe(at(100), sample(30, 0), 90 * MIB);
        assert!(
            matches!(r, Some(Resize::Shrink { to, .. }) if to == 70 * MIB),
            "{r:?}"
        );
        // Nothing available: 50 MiB lower at each sample, down to the floor, then no message.
        assert!(w.observe(at(200), sample(0, 0), 70 * MIB).is_some());
        assert_eq!(w.budget(), 20 * MIB);
        assert!(w.observe(at(250), sample(0, 0), 20 * MIB).is_some());
        assert_eq!(w.budget(), 10 * MIB);
        assert_eq!(w.observe(at(300), sample(0, 0), 10 * MIB), None);
        // Between the reserve and twice it: hold.
        assert_eq!(w.observe(at(400), sample(60, 0), 10 * MIB), None);
        // Calm, but not for long enough yet.
        assert_eq!(w.observe(at(500), sample(200, 0), 10 * MIB), None);
        assert_eq!(w.observe(at(1400), sample(200, 0), 10 * MIB), None);
        // A second of calm: back up to what leaves twice the reserve, capped at the size.
        let r = w.observe(at(1500), sample(200, 0), 10 * MIB);
        assert!(
            matches!(r, Some(Resize::Grow { to, .. }) if to == 100 * MIB),
            "{r:?}"
        );
    }

    #[test]
    fn growth_counts_what_is_held_so_an_unfilled_budget_is_not_raised_twice() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Watch::new(1000 * MIB, 0, 50 * MIB);
        w.observe(at(0), sample(0, 0), 100 * MIB);
        assert_eq!(w.budget(), 100 * MIB - 50 * MIB - 50 * MIB / 4);
        w.observe(at(100), sample(300, 0), 40 * MIB);
        // 40 held + (300 - 100) = 240, however often it is sampled before the cache fills.
        assert!(w.observe(at(1100), sample(300, 0), 40 * MIB).is_some());
        assert_eq!(w.budget(), 240 * MIB);
        assert_eq!(w.observe(at(1200), sample(300, 0), 40 * MIB), None);
        assert_eq!(w.budget(), 240 * MIB);
    }

    #[test]
    fn stalls_alone_shrink_by_an_eighth() {
        let t0 = Instant::now();
        let mut w = Watch::new(80 * MIB, 0, 10 * MIB);
        w.observe(t0, sample(500, 1_000), 80 * MIB);
        // 20 ms stalled in 100 ms: over the 10% share.
        let r = w.observe(
            t0 + Duration::from_millis(100),
            sample(500, 21_000),
            80 * MIB,
        );
        assert!(matches!(r, Some(Resize::Shrink { to, stalled: true, .. }) if to == 70 * MIB));
        assert!(r.unwrap().to_string().contains("stalled on memory"));
    }
}
