//! Measuring memory: the real bytes of the storage bound to each live plan buffer (a pass's
//! tensors between pieces under its "work" buffer), plus the workspace no buffer holds and
//! the messages the rank has received and not yet combined (its mailbox), after every op
//! and whenever messages come in.

use std::collections::BTreeMap;

use strata_models::plan::{BufClass, BufId};
use strata_models::trace::MemSample;

use super::pool::BufKey;
use super::units::UnitVecs;
use super::{RankExec, T};
use crate::layer::LayerActs;

impl RankExec {
    fn units_bytes(u: &UnitVecs) -> u64 {
        u.values().map(|v| v.len() as u64 * 4).sum()
    }

    /// Which live plan buffer holds an in-flight tensor: the "work" buffer of its pass while
    /// that pass runs; between a split backward's input and weight passes, the first chunk's
    /// residual gradient waits for the embedding's deferred weight pass in "embed grad mb…";
    /// anything else is unattributed.
    fn flight_owner(&self, chunk: u32, mb: u32, t: T) -> Option<BufKey> {
        let work = BufKey::Work { chunk, mb };
        if self.live_keys.contains(&work) {
            return Some(work);
        }
        let embed = BufKey::EmbedGrad { mb };
        (chunk == 0 && t == T::Dr && self.live_keys.contains(&embed)).then_some(embed)
    }

    /// Bytes of the in-flight tensors whose owner `of` selects.
    fn flight_bytes(&self, of: impl Fn(Option<BufKey>) -> bool) -> u64 {
        self.flight
            .iter()
            .filter(|((c, m, t), _)| of(self.flight_owner(*c, *m, *t)))
            .map(|(_, v)| v.len() as u64 * 4)
            .sum()
    }

    /// Real bytes of the storage bound to a plan buffer.
    pub(super) fn slot_bytes(&self, buf: BufId, key: BufKey) -> u64 {
        let c = |chunk: u32| &self.chunks[chunk as usize];
        let acts_bytes = |a: Option<&LayerActs>| a.map_or(0, |a| a.bytes() as u64);
        match key {
            BufKey::Params { chunk } => {
                Self::units_bytes(&c(chunk).params)
                    + c(chunk).param_shards.iter().map(|v| v.len() as u64 * 4).sum::<u64>()
            }
            BufKey::Grads { chunk } => {
                Self::units_bytes(&c(chunk).grads)
                    + c(chunk).grad_shards.iter().map(|v| v.len() as u64 * 4).sum::<u64>()
            }
            BufKey::Optimizer { chunk } => c(chunk).opt.iter().map(|o| o.adamw.state_bytes() as u64).sum(),
            BufKey::Embed { .. } => 0,
            BufKey::EmbedGrad { mb } => self.flight_bytes(|o| o == Some(BufKey::EmbedGrad { mb })),
            BufKey::Act { layer, mb } => {
                let a = self.acts.get(&(layer, mb));
                let probs = if self.live_keys.contains(&BufKey::Scores { layer, mb })
                    && !self.rc_acts.contains_key(&(layer, mb))
                {
                    a.map_or(0, |a| a.probs.bytes() as u64)
                } else {
                    0
                };
                // Output gradients kept for deferred weight passes are their own buffer's.
                let wgrad = if self.live_keys.contains(&BufKey::WeightGrad { layer, mb }) {
                    a.map_or(0, |a| a.weight_grad_bytes() as u64)
                } else {
                    0
                };
                let moe = self.moe.get(&(layer, mb)).filter(|m| !m.recomputed).map_or(0, |m| m.bytes());
                acts_bytes(a) - probs - wgrad + moe
            }
            BufKey::WeightGrad { layer, mb } => {
                let a = self.rc_acts.get(&(layer, mb)).or_else(|| self.acts.get(&(layer, mb)));
                a.map_or(0, |a| a.weight_grad_bytes() as u64)
            }
            BufKey::Recompute { layer, mb } => {
                let a = self.rc_acts.get(&(layer, mb));
                let probs = if self.live_keys.contains(&BufKey::Scores { layer, mb }) {
                    a.map_or(0, |a| a.probs.bytes() as u64)
                } else {
                    0
                };
                // As for `Act`: the output gradients kept in them are `WeightGrad`'s.
                let wgrad = if self.live_keys.contains(&BufKey::WeightGrad { layer, mb }) {
                    a.map_or(0, |a| a.weight_grad_bytes() as u64)
                } else {
                    0
                };
                let moe = self.moe.get(&(layer, mb)).filter(|m| m.recomputed).map_or(0, |m| m.bytes());
                acts_bytes(a) - probs - wgrad + moe
            }
            BufKey::Scores { layer, mb } => {
                let a = self.rc_acts.get(&(layer, mb)).or_else(|| self.acts.get(&(layer, mb)));
                a.map_or(0, |a| a.probs.bytes() as u64)
            }
            BufKey::Head { mb } => self.heads.get(&mb).map_or(0, |h| h.bytes() as u64),
            BufKey::Msg { .. } => {
                self.msgs.get(&key).map_or(0, |v| v.len() as u64 * 4) + self.msg_held.get(&key).map_or(0, |b| *b as u64)
            }
            BufKey::Gathered { .. } => self.gathered.get(&buf).map_or(0, Self::units_bytes),
            BufKey::GradBucket { chunk, bucket, mb } => {
                self.grad_buckets.get(&(chunk, bucket, mb)).map_or(0, Self::units_bytes)
            }
            BufKey::Work { chunk, mb } => self.flight_bytes(|o| o == Some(BufKey::Work { chunk, mb })),
            BufKey::Cp { layer, mb, role } => self.cp_store.get(&(layer, mb, role)).map_or(0, |v| v.len() as u64 * 4),
        }
    }

    /// Measures every live buffer and the workspace (after every op of every step, so the
    /// peaks are the run's); records a sample when the total moved and `samples` is given.
    pub(super) fn measure(&mut self, t_ns: u64, samples: Option<&mut Vec<MemSample>>) {
        let mut by_class: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut predicted: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut plan_total = 0;
        for (&buf, slot) in &self.pool.live {
            let b = self.slot_bytes(buf, slot.key);
            *by_class.entry(slot.class.key()).or_default() += b;
            *predicted.entry(slot.class.key()).or_default() += slot.predicted;
            plan_total += b;
        }
        // In-flight tensors a live buffer holds are that buffer's.
        let workspace = self.flight_bytes(|o| o.is_none()) + self.cp_work.values().map(|w| w.bytes()).sum::<u64>();
        let comm = self.mailbox.inbox_bytes() as u64;
        *by_class.entry(BufClass::Workspace.key()).or_default() += workspace;
        *by_class.entry(BufClass::CommBuffer.key()).or_default() += comm;
        let total = plan_total + workspace + comm;
        let pk = &mut self.peaks;
        pk.measured_bytes = pk.measured_bytes.max(total);
        pk.measured_plan_bytes = pk.measured_plan_bytes.max(plan_total);
        pk.predicted_bytes = pk.predicted_bytes.max(self.pool.predicted_bytes());
        for (k, v) in by_class {
            let e = pk.by_class.entry(k.to_string()).or_default();
            *e = (*e).max(v);
        }
        for (k, v) in predicted {
            let e = pk.predicted_by_class.entry(k.to_string()).or_default();
            *e = (*e).max(v);
        }
        if total != self.last_total {
            self.last_total = total;
            if let Some(samples) = samples {
                samples.push(MemSample { rank: self.rank, t_ns, bytes: total });
            }
        }
    }
}
