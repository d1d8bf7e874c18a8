//! Which CPUs a thread may run on: the engine's own threads (reads ahead, arena loaders) are kept
//! off the cores the compute threads are pinned to, so a reader never takes a turn on a core a
//! ggml barrier waits for.

use std::sync::OnceLock;

/// The CPUs this process could run on when the engine first asked (at backend start, before any
/// threadpool pinned a thread), ascending. ggml pins the thread that creates a pinned pool for
/// good, so later questions to the kernel would see that one CPU.
pub fn process_cpus() -> &'static [usize] {
    static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
    CPUS.get_or_init(|| current_thread_cpus().unwrap_or_default())
}

/// Restricts the calling thread to `cpus` (no-op for an empty list). CPUs past the kernel's
/// `cpu_set_t` (1,024) are ignored.
pub fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET only writes inside the set (the index
    // is checked against its size first); sched_setaffinity reads `size_of::<cpu_set_t>()` bytes
    // of a set that lives for the call, for thread 0 (the caller).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < 8 * std::mem::size_of::<libc::cpu_set_t>() {
                libc::CPU_SET(c, &mut set);
            }
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The CPUs the calling thread may run on, ascending.
pub fn current_thread_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: sched_getaffinity fills a set that lives for the call; CPU_ISSET reads inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Ok((0..n).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_reports_its_cpu() {
        let all = current_thread_cpus().unwrap();
        let first = all[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), vec![first]);
        })
        .join()
        .unwrap();
    }
}
