//! `[model.moe]` and `[model.mla]` as a scenario writes them: every key optional, laid over
//! the preset's, so that `--set model.moe.top_k=1` changes one key of a preset's experts. A
//! model without a preset (or a preset without experts) must give the required keys.

use serde::{Deserialize, Serialize};

use super::ScenarioError;
use crate::model::{MlaSpec, MoeSpec, RouterScore};

macro_rules! raw {
    ($raw:ident for $spec:ident { $($field:ident : $ty:ty),* $(,)? } required [$($req:ident),*]) => {
        #[derive(Clone, Debug, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $raw {
            $(#[serde(default, skip_serializing_if = "Option::is_none")] $field: Option<$ty>,)*
        }

        impl $raw {
            /// The keys given, over `base`'s; `table` names the table in errors.
            pub(super) fn resolve(self, base: Option<&$spec>, origin: &str, table: &str) -> Result<$spec, ScenarioError> {
                let missing = |key: &str| ScenarioError::Missing {
                    origin: origin.to_string(),
                    section: "model",
                    key: format!("{table}.{key}"),
                };
                let d = match base {
                    Some(b) => b.clone(),
                    None => $spec::defaults($(self.$req.ok_or_else(|| missing(stringify!($req)))?),*),
                };
                Ok($spec { $($field: self.$field.unwrap_or(d.$field),)* })
            }
        }

        impl From<&$spec> for $raw {
            fn from(s: &$spec) -> $raw {
                $raw { $($field: Some(s.$field.clone()),)* }
            }
        }
    };
}

raw!(RawMoe for MoeSpec {
    experts: u32,
    top_k: u32,
    expert_ffn_hidden: u32,
    shared_experts: u32,
    shared_ffn_hidden: u32,
    dense_layers: u32,
    capacity_factor: Option<f64>,
    score: RouterScore,
    aux_loss_coeff: f64,
    skew: Option<f64>,
} required [experts, top_k, expert_ffn_hidden]);

raw!(RawMla for MlaSpec {
    q_lora_rank: u32,
    kv_lora_rank: u32,
    qk_nope_head_dim: u32,
    qk_rope_head_dim: u32,
    v_head_dim: u32,
} required [q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim]);

impl MoeSpec {
    fn defaults(experts: u32, top_k: u32, expert_ffn_hidden: u32) -> MoeSpec {
        MoeSpec::routed(experts, top_k, expert_ffn_hidden, 0.0)
    }
}

impl MlaSpec {
    fn defaults(
        q_lora_rank: u32,
        kv_lora_rank: u32,
        qk_nope_head_dim: u32,
        qk_rope_head_dim: u32,
        v_head_dim: u32,
    ) -> MlaSpec {
        MlaSpec { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim }
    }
}
