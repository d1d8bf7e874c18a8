//! The graph's vocabulary: llama.cpp's node and weight names (the layer a node or weight belongs
//! to, which expert matrix a weight is), and the capture pass that learns a model's graph once.
pub mod capture;

pub use crate::error::ExpertOutOfRange;
pub use capture::{Capture, CaptureHook};

/// Which expert matrix a `MUL_MAT_ID` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertRole {
    /// `ffn_gate_exps`.
    Gate,
    /// `ffn_up_exps`.
    Up,
    /// `ffn_down_exps`.
    Down,
    /// Fused `ffn_gate_up_exps`.
    GateUp,
}

/// `blk.<il>.<suffix>` -> (il, suffix).
pub fn layer_of(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (il, suffix) = rest.split_once('.')?;
    Some((il.parse().ok()?, suffix))
}

/// `<prefix>-<il>` node names -> il.
pub fn node_layer(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.strip_prefix('-')?.parse().ok()
}

/// The expert matrix an expert tensor's name suffix names.
pub fn expert_role(suffix: &str) -> Option<ExpertRole> {
    Some(match suffix {
        "ffn_gate_exps.weight" => ExpertRole::Gate,
        "ffn_up_exps.weight" => ExpertRole::Up,
        "ffn_down_exps.weight" => ExpertRole::Down,
        "ffn_gate_up_exps.weight" => ExpertRole::GateUp,
        _ => return None,
    })
}

/// The experts a routing node's `ids` select in layer `layer`, as a mask over its `n_expert`
/// experts; an id outside `0..n_expert` is an error (the streamer and the arena both decode
/// routing with this, so they refuse the same ids).
pub fn routed_mask(
    layer: u32,
    ids: &[i32],
    n_expert: usize,
) -> Result<Vec<bool>, ExpertOutOfRange> {
    let mut mask = vec![false; n_expert];
    for &e in ids {
        let i = usize::try_from(e)
            .ok()
            .filter(|&i| i < n_expert)
            .ok_or(ExpertOutOfRange {
                layer,
                expert: e,
                n_expert,
            })?;
        mask[i] = true;
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            layer_of("blk.12.ffn_up_exps.weight"),
            Some((12, "ffn_up_exps.weight"))
        );
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(node_layer("ffn_moe_topk-3", "ffn_moe_topk"), Some(3));
        assert_eq!(node_layer("ffn_moe_topk-3 (view)", "ffn_moe_topk"), None);
        assert_eq!(
            expert_role("ffn_gate_up_exps.weight"),
            Some(ExpertRole::GateUp)
        );
    }

    #[test]
    fn routed_ids_decode_to_a_mask_and_refuse_out_of_range() {
        assert_eq!(
            routed_mask(2, &[0, 3, 3], 4),
            Ok(vec![true, false, false, true])
        );
        let e = routed_mask(2, &[1, 4], 4).unwrap_err();
        assert_eq!(e.to_string(), "layer 2 routed to expert 4, out of 0..4");
        assert!(routed_mask(0, &[-1], 4).is_err());
    }
}
