//! A MoE layer's views of a chunk's parameters: its routed experts from their own block
//! (`Unit::Experts`), and the MoE MLP's tensors (router, shared experts, experts) as
//! `runtime::moe` takes them.

use super::{LayerTensors, ParamLayout, split, split_mut};

/// The MoE MLP's tensors from a MoE layer's views (router, shared experts in fc1/fc2, empty
/// without them) and its routed experts.
pub fn moe_tensors<S: AsRef<[f32]>>(
    l: LayerTensors<S>,
    experts: Vec<crate::moe::ExpertTensors<S>>,
) -> crate::moe::MoeTensors<S> {
    let shared = (!l.fc1_w.as_ref().is_empty()).then_some(crate::moe::ExpertTensors {
        fc1_w: l.fc1_w,
        fc1_b: l.fc1_b,
        fc2_w: l.fc2_w,
        fc2_b: l.fc2_b,
    });
    crate::moe::MoeTensors { router_w: l.router_w, experts, shared }
}

impl ParamLayout {
    /// One routed expert's tensor sizes in buffer order (fc1_w, fc1_b, fc2_w, fc2_b): GELU
    /// (h·fe, fe, fe·h, h), or SwiGLU without biases (h·2fe, 0, fe·h, 0).
    fn expert_sizes(&self, d: &crate::moe::MoeDims) -> [usize; 4] {
        if self.dims.llama {
            [d.hidden * 2 * d.ffn, 0, d.ffn * d.hidden, 0]
        } else {
            [d.hidden * d.ffn, d.ffn, d.ffn * d.hidden, d.hidden]
        }
    }

    /// Views of the routed experts of local layer `local` from their own block (the
    /// `Unit::Experts` range held apart); empty for a dense layer.
    pub fn experts_block<'a>(&self, block: &'a [f32]) -> Vec<crate::moe::ExpertTensors<&'a [f32]>> {
        let Some(d) = self.moe else { return Vec::new() };
        let sizes = self.expert_sizes(&d);
        let n: usize = sizes.iter().sum();
        assert!(block.len().is_multiple_of(n), "an experts block of {} elements", block.len());
        block
            .chunks_exact(n)
            .map(|b| {
                let [fc1_w, fc1_b, fc2_w, fc2_b] = split(b, sizes);
                crate::moe::ExpertTensors { fc1_w, fc1_b, fc2_w, fc2_b }
            })
            .collect()
    }

    /// Mutable views of an experts block (see [`ParamLayout::experts_block`]).
    pub fn experts_block_mut<'a>(&self, block: &'a mut [f32]) -> Vec<crate::moe::ExpertTensors<&'a mut [f32]>> {
        let Some(d) = self.moe else { return Vec::new() };
        let sizes = self.expert_sizes(&d);
        let n: usize = sizes.iter().sum();
        assert!(block.len().is_multiple_of(n), "an experts block of {} elements", block.len());
        block
            .chunks_exact_mut(n)
            .map(|b| {
                let [fc1_w, fc1_b, fc2_w, fc2_b] = split_mut(b, sizes);
                crate::moe::ExpertTensors { fc1_w, fc1_b, fc2_w, fc2_b }
            })
            .collect()
    }

    /// The MoE MLP's tensors of local layer `local` of a flat parameter buffer: the router
    /// and shared experts from the layer's block, the routed experts from theirs.
    pub fn moe_params<'a>(&self, buf: &'a [f32], local: usize) -> crate::moe::MoeParams<'a> {
        moe_tensors(self.layer(buf, local), self.experts_block(&buf[self.experts_range(local)]))
    }

    /// Mutable views of the same, and the layer's other tensors (which share its block).
    pub fn moe_grads<'a>(&self, buf: &'a mut [f32], local: usize) -> crate::moe::MoeGrads<'a> {
        let (r, e) = (self.layer_range(local), self.experts_range(local));
        assert_eq!(r.end, e.start, "a MoE layer's experts follow its block");
        let (front, back) = buf.split_at_mut(e.start);
        let layer = LayerTensors::from_array(split_mut(&mut front[r], self.layer_sizes[local]));
        moe_tensors(layer, self.experts_block_mut(&mut back[..e.len()]))
    }
}
