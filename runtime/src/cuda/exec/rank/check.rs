//! What the CUDA executor runs: a plan's settings checked before any GPU work, each refusal
//! naming the value and what to do instead.

use super::*;

/// What this executor runs, checked before any GPU work.
pub fn check_plan(plan: &Plan) -> Res<()> {
    let s = &plan.scenario;
    let (p, t) = (&s.parallel, &s.training);
    if p.schedule.splits_backward() {
        return Err(unsupported(format!(
            "parallel.schedule = \"{}\": the zero-bubble schedules' deferred weight-gradient passes are not \
             built on the GPU; use \"1f1b\", \"interleaved\" or \"gpipe\"",
            p.schedule.key()
        )));
    }
    if p.cp > 1 {
        return Err(unsupported(format!("parallel.cp = {}: context parallelism is not built on the GPU", p.cp)));
    }
    if s.model.moe.is_some() {
        return Err(unsupported(
            "model.moe: mixture-of-experts layers (router, expert all-to-all, experts) are not built on the GPU; \
             use a dense model",
        ));
    }
    if s.model.mla.is_some() {
        return Err(unsupported("model.mla: multi-head latent attention is not built on the GPU; use a dense model"));
    }
    if s.model.mtp_layers > 0 {
        return Err(unsupported(format!(
            "model.mtp_layers = {}: multi-token prediction is not built on the GPU; set it to 0",
            s.model.mtp_layers
        )));
    }
    if s.model.family == Family::Llama && f64::from(s.model.rope_base as f32) != s.model.rope_base {
        return Err(unsupported(format!(
            "model.rope_base = {}: the RoPE kernel takes the base as an fp32, which does not hold this value \
             exactly; use one that fp32 holds (e.g. 500000 or 10000)",
            s.model.rope_base
        )));
    }
    if t.storage_dtype() != Dtype::Bf16 {
        return Err(unsupported(format!("training.dtype = {:?}: the CUDA executor stores bf16", t.dtype)));
    }
    if !t.flash_attention {
        return Err(unsupported(
            "training.flash_attention = false: the executor's attention is the fused flash-style kernel",
        ));
    }
    // The attention kernels keep a row of head_dim in registers, 8 per lane (`MAXD`).
    if s.model.head_dim() > 256 {
        return Err(unsupported(format!(
            "head_dim = hidden / heads = {}: the attention kernels take head_dim ≤ 256",
            s.model.head_dim()
        )));
    }
    if p.zero > 1 && s.training.framework.accumulates_unsharded(s) {
        return Err(unsupported(format!(
            "parallel.zero = {} with gradients accumulated unsharded over the microbatches (torchtitan with a \
             pipeline): not built on the GPU; use another training.framework",
            p.zero
        )));
    }
    Ok(())
}
