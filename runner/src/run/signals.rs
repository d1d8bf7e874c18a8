//! Ctrl-C, SIGTERM and SIGHUP (ctrlc's "termination" feature: what Kubernetes eviction and Slurm
//! time limits send): the first finishes the row in flight and stops cleanly with the resume hint;
//! a second abandons that row (a generate stops at the next token and is not written, so `--resume`
//! runs it again).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bmoe_engine::CancelToken;

/// Shared stop state.
#[derive(Clone, Default)]
pub struct Stop {
    requested: Arc<AtomicBool>,
    /// Cancels the call in flight.
    pub cancel: CancelToken,
}

impl Stop {
    /// Installs the handler for SIGINT, SIGTERM and SIGHUP (once per process); without a handler
    /// the state never trips.
    pub fn install() -> Self {
        let s = Stop::default();
        let h = s.clone();
        let res = ctrlc::set_handler(move || {
            if h.requested.swap(true, Ordering::SeqCst) {
                eprintln!("\nbmoe: second interrupt: abandoning the row in flight");
                h.cancel.cancel();
            } else {
                eprintln!("\nbmoe: interrupt or termination signal: finishing the row in flight, then stopping (a second signal abandons it)");
            }
        });
        if let Err(e) = res {
            eprintln!("bmoe: cannot watch for Ctrl-C or SIGTERM ({e}); a signal will kill the run (rows written stay complete)");
        }
        s
    }

    /// True once an interrupt asked to stop.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Asks to stop as a first signal does: a limited point's child is told so by its parent
    /// (its stdin closed), since a signal sent to the parent alone never reaches it.
    pub fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
    }
}
