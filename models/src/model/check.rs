//! Structural checks of a mixture-of-experts MLP and of multi-head latent attention (which
//! sets its own head widths, so not `model.head_dim`): the
//! shapes that must hold whatever the parallel split (the split's own rules, such as
//! experts divisible by ep, are in [`crate::parallel`]).

use super::{Family, ModelSpec};

impl ModelSpec {
    /// Appends one line per broken MoE or MLA rule, each naming the values.
    pub(super) fn check_moe_mla(&self, bad: &mut Vec<String>) {
        if let Some(moe) = &self.moe {
            for (key, v) in
                [("experts", moe.experts), ("top_k", moe.top_k), ("expert_ffn_hidden", moe.expert_ffn_hidden)]
            {
                if v == 0 {
                    bad.push(format!("model.moe.{key} = 0: it must be at least 1"));
                }
            }
            if moe.top_k > moe.experts && moe.experts > 0 {
                bad.push(format!(
                    "model.moe.top_k = {} exceeds model.moe.experts = {}: each token picks top_k distinct experts",
                    moe.top_k, moe.experts
                ));
            }
            if moe.dense_layers > self.layers {
                bad.push(format!(
                    "model.moe.dense_layers = {} exceeds model.layers = {}: the dense layers are the first of the model's layers",
                    moe.dense_layers, self.layers
                ));
            }
            if (moe.shared_experts == 0) != (moe.shared_ffn_hidden == 0) {
                bad.push(format!(
                    "model.moe.shared_experts = {} with model.moe.shared_ffn_hidden = {}: a shared expert needs a width, and a width needs shared experts (both 0 or both positive)",
                    moe.shared_experts, moe.shared_ffn_hidden
                ));
            }
            if let Some(c) = moe.capacity_factor
                && !(c > 0.0 && c.is_finite())
            {
                bad.push(format!(
                    "model.moe.capacity_factor = {c}: an expert's capacity is a positive multiple of an even share (leave it out for dropless routing)"
                ));
            }
            if !(moe.aux_loss_coeff >= 0.0 && moe.aux_loss_coeff.is_finite()) {
                bad.push(format!(
                    "model.moe.aux_loss_coeff = {}: the load-balancing loss coefficient is a finite number ≥ 0",
                    moe.aux_loss_coeff
                ));
            }
            if let Some(g) = moe.skew
                && !(0.0..1.0).contains(&g)
            {
                bad.push(format!("model.moe.skew = {g}: a Gini coefficient of tokens over experts is in [0, 1)"));
            }
        }
        if let Some(a) = &self.mla {
            for (key, v) in [
                ("kv_lora_rank", a.kv_lora_rank),
                ("qk_nope_head_dim", a.qk_nope_head_dim),
                ("qk_rope_head_dim", a.qk_rope_head_dim),
                ("v_head_dim", a.v_head_dim),
            ] {
                if v == 0 {
                    bad.push(format!("model.mla.{key} = 0: it must be at least 1"));
                }
            }
            if self.family != Family::Llama {
                bad.push(format!(
                    "model.mla with model.family = \"{}\": latent attention carries positions in its decoupled rotary key, so it needs rotary positions (family = \"llama\")",
                    if self.family == Family::Gpt { "gpt" } else { "?" }
                ));
            }
            if let Some(d) = self.head_dim {
                bad.push(format!(
                    "model.head_dim = {d} with model.mla: latent attention's head widths are model.mla.qk_nope_head_dim, qk_rope_head_dim and v_head_dim; leave model.head_dim out"
                ));
            }
            if self.kv_heads != self.heads {
                bad.push(format!(
                    "model.mla with model.kv_heads = {} ≠ model.heads = {}: latent attention up-projects a key and a value for every head (no grouped-query sharing); set kv_heads = heads",
                    self.kv_heads, self.heads
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{MlaSpec, ModelSpec};

    fn moe_error(edit: impl Fn(&mut crate::model::MoeSpec)) -> String {
        let mut m = ModelSpec::preset("tiny-moe").unwrap();
        edit(m.moe.as_mut().unwrap());
        m.check().unwrap_err()
    }

    #[test]
    fn moe_shapes_are_checked_with_their_values() {
        let e = moe_error(|e| e.top_k = 9);
        assert!(e.contains("model.moe.top_k = 9 exceeds model.moe.experts = 8"), "{e}");
        assert!(moe_error(|e| e.top_k = 0).contains("model.moe.top_k = 0"));
        assert!(moe_error(|e| e.dense_layers = 5).contains("model.moe.dense_layers = 5 exceeds model.layers = 4"));
        assert!(
            moe_error(|e| e.shared_experts = 1)
                .contains("model.moe.shared_experts = 1 with model.moe.shared_ffn_hidden = 0")
        );
        assert!(moe_error(|e| e.shared_ffn_hidden = 64).contains("shared_ffn_hidden = 64"));
        assert!(moe_error(|e| e.capacity_factor = Some(0.0)).contains("model.moe.capacity_factor = 0"));
        assert!(moe_error(|e| e.capacity_factor = Some(f64::NAN)).contains("capacity_factor = NaN"));
        assert!(moe_error(|e| e.skew = Some(1.5)).contains("model.moe.skew = 1.5"));
        // The limit on experts, naming key, value and maximum.
        let e = moe_error(|e| e.experts = 4096);
        assert!(e.contains("model.moe.experts = 4096 is over the limit of 1024"), "{e}");
        let mut ok = ModelSpec::preset("tiny-moe").unwrap();
        ok.moe.as_mut().unwrap().capacity_factor = Some(1.25);
        ok.check().unwrap();
    }

    #[test]
    fn mla_needs_rope_and_a_key_per_head() {
        let mla =
            MlaSpec { q_lora_rank: 0, kv_lora_rank: 16, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 };
        let mut m = ModelSpec::preset("tiny-llama").unwrap();
        m.mla = Some(mla.clone());
        let e = m.check().unwrap_err();
        assert!(e.contains("model.kv_heads = 2 ≠ model.heads = 4"), "{e}");
        m.kv_heads = 4;
        m.check().unwrap();
        let mut g = ModelSpec::preset("tiny-gpt").unwrap();
        g.mla = Some(mla.clone());
        let e = g.check().unwrap_err();
        assert!(e.contains("family = \"gpt\""), "{e}");
        g.mla = Some(MlaSpec { kv_lora_rank: 0, ..mla });
        let e = g.check().unwrap_err();
        assert!(e.contains("model.mla.kv_lora_rank = 0 is below the minimum of 1"), "{e}");
        ModelSpec::preset("deepseek-v3").unwrap().check().unwrap();
    }
}
