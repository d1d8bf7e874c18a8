//! A routing node's expert ids as a mask, checked against the layer's experts.
use crate::error::ExpertOutOfRange;

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
