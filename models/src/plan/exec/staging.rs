//! What the CPU executor copies around a collective besides the collective itself: the
//! flat message it builds from a rank's per-unit tensors before posting, and what it writes
//! back after. The simulator charges it to the rank's thread ([`staging`]); the executor
//! (`strata_runtime::exec::coll`) does it, and its tests hold the two together.
//!
//! Tensor-parallel, context-parallel and expert-parallel collectives move tensors the pieces
//! hand over (or clone small ones); their CPU cost is in the in-job calibration of those
//! collectives, so they stage nothing here.

use crate::plan::ir::{CollKind, CollPurpose, CollectiveOp};

/// Bytes one rank copies around one collective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Staging {
    /// Copied into a freshly allocated message before posting (the thread's post work).
    pub post_fresh: u64,
    /// Copied over tensors the rank already holds after the result arrived (finishing).
    pub finish_copied: u64,
    /// Copied into freshly allocated per-unit tensors (a layer's, an embedding's) after the
    /// result arrived (finishing).
    pub finish_fresh: u64,
}

/// What the CPU executor stages for collective `c` on a group of `members` ranks under ZeRO
/// stage `zero` (the scenario's `zero_stage()`). `c.bytes` is the whole buffer S; a member
/// owns S / members of it.
pub fn staging(c: &CollectiveOp, zero: u8, members: u32) -> Staging {
    let whole = c.bytes;
    let owned = whole / u64::from(members.max(1));
    let (post_fresh, finish_copied, finish_fresh) = match c.purpose {
        // The bucket leaves the gradient tensors whole; the reduced result comes back whole
        // (all-reduce), or the owned part is written back (ZeRO-1) or added to the shard.
        CollPurpose::GradBucket { .. } | CollPurpose::ExpertGradBucket { .. } => {
            let back = if zero == 0 || c.kind == CollKind::AllReduce { whole } else { owned };
            (whole, back, 0)
        }
        // ZeRO-1/2 after the step: the owned part out, the whole bucket written back.
        CollPurpose::ParamBucket { .. } => (owned, whole, 0),
        // ZeRO-3: the shard out, the gathered bucket into fresh per-unit tensors.
        CollPurpose::ParamGather { .. } => (owned, 0, whole),
        // The owned part of the word table's gradient (a shard under ZeRO ≥ 2, replaced by
        // the result; written back under ZeRO < 2).
        CollPurpose::TiedEmbeddingGrad => (whole, if zero < 2 { whole } else { 0 }, 0),
        // The replicated tensors' gradients gathered into one message and written back.
        CollPurpose::SpReplicatedGrads => (whole, whole, 0),
        CollPurpose::Tp { .. } | CollPurpose::GradNorm | CollPurpose::Moe { .. } | CollPurpose::Cp { .. } => (0, 0, 0),
    };
    Staging { post_fresh, finish_copied, finish_fresh }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;
    use crate::plan::ir::{GroupKind, Phase, Piece, TpSite};

    fn op(kind: CollKind, purpose: CollPurpose) -> CollectiveOp {
        CollectiveOp { kind, group: GroupKind::Dp, bytes: 4000, dtype: Dtype::Fp32, purpose }
    }

    #[test]
    fn buckets_stage_what_the_executor_copies() {
        let grads = CollPurpose::GradBucket { chunk: 0, bucket: 0, mb: 0 };
        let s = |kind, purpose, zero| staging(&op(kind, purpose), zero, 4);
        // ZeRO-0: the whole bucket out and back.
        assert_eq!(
            s(CollKind::AllReduce, grads, 0),
            Staging { post_fresh: 4000, finish_copied: 4000, finish_fresh: 0 }
        );
        // ZeRO-1/2: the whole bucket out, the owned quarter back.
        for zero in [1, 2] {
            let got = s(CollKind::ReduceScatter, grads, zero);
            assert_eq!(got, Staging { post_fresh: 4000, finish_copied: 1000, finish_fresh: 0 });
        }
        // DeepSpeed's BF16_Optimizer all-reduces under ZeRO-1: whole back.
        assert_eq!(s(CollKind::AllReduce, grads, 1).finish_copied, 4000);
        // After the step: the owned quarter out, the whole bucket written back.
        let params = CollPurpose::ParamBucket { chunk: 0, bucket: 0 };
        assert_eq!(
            s(CollKind::AllGather, params, 1),
            Staging { post_fresh: 1000, finish_copied: 4000, finish_fresh: 0 }
        );
        // ZeRO-3: the shard out, the gathered bucket into fresh tensors.
        let gather = CollPurpose::ParamGather { chunk: 0, bucket: 0, mb: 0, phase: Phase::Forward };
        assert_eq!(
            s(CollKind::AllGather, gather, 3),
            Staging { post_fresh: 1000, finish_copied: 0, finish_fresh: 4000 }
        );
        // The tied word table's shard: replaced by the result under ZeRO ≥ 2.
        assert_eq!(s(CollKind::AllReduce, CollPurpose::TiedEmbeddingGrad, 2).finish_copied, 0);
        assert_eq!(s(CollKind::AllReduce, CollPurpose::TiedEmbeddingGrad, 1).finish_copied, 4000);
    }

    #[test]
    fn tensor_parallel_collectives_stage_nothing_here() {
        let tp = CollPurpose::Tp {
            site: TpSite::Gather,
            piece: Piece::Attn,
            phase: Phase::Forward,
            mb: 0,
            chunk: 0,
            layer: 0,
        };
        assert_eq!(staging(&op(CollKind::AllGather, tp), 0, 2), Staging::default());
        assert_eq!(staging(&op(CollKind::AllReduce, CollPurpose::GradNorm), 3, 8), Staging::default());
    }
}
