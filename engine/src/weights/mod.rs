//! Where a model's weights live: the one owner of every move of a weight (`residency`). Nothing
//! else in the engine rebinds, re-types or restores a weight tensor (`engine/tests/layering.rs`
//! checks it); each move takes the proof that no graph computes (`Quiet`, lent by the model's
//! held execution lock).
pub mod residency;
pub mod table;

pub use crate::ffi::quiet::{ExecGuard, Quiet};
