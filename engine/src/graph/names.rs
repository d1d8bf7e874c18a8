//! llama.cpp's node and weight names: the layer a node or weight belongs to, and which expert
//! matrix a weight is.

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
}
