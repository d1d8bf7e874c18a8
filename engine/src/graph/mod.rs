//! The graph's vocabulary: llama.cpp's node and weight names (the layer a node or weight belongs
//! to, which expert matrix a weight is), routing ids as expert masks, and the capture pass that
//! learns a model's graph once.
pub mod capture;
pub mod names;
pub mod routing;

pub use capture::{Capture, CaptureHook};
pub use names::{layer_of, node_layer, ExpertRole};
pub use routing::routed_mask;
