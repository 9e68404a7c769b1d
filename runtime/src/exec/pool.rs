//! The memory pool: the plan's `Alloc`/`Free` ops bound to the executor's real storage.
//!
//! Each `Alloc` opens a slot for a plan buffer (its class and the plan's predicted bytes)
//! and binds it to what the executor keeps for it, found from the buffer's name as the
//! lowering writes it (`act L3 mb1` → the saved activations of layer 3, microbatch 1);
//! each `Free` drops that storage. The *measured* bytes of a slot are the bytes of the
//! storage bound to it at the moment of measuring (real `Vec` lengths, see
//! `RankExec::slot_bytes`), so measured and predicted memory share one timeline: the
//! plan's buffers, their lifetimes from the plan, their sizes from reality. Storage the
//! plan does not name (messages that arrived before their receive was posted, the tensors
//! passed between the pieces of a microbatch outside the pass that made them) is measured
//! as `comm` and `workspace`.

use std::collections::BTreeMap;

use strata_models::plan::{BufClass, BufId, P2pKind};

/// What a plan buffer holds, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BufKey {
    Params {
        chunk: u32,
    },
    Grads {
        chunk: u32,
    },
    Optimizer {
        chunk: u32,
    },
    /// The embedding's saved state of a microbatch (a dropout mask, absent here).
    Embed {
        mb: u32,
    },
    /// A split backward: the embedding's output gradient, waiting for its weight pass.
    EmbedGrad {
        mb: u32,
    },
    /// A layer's saved activations.
    Act {
        layer: u32,
        mb: u32,
    },
    /// A layer's activations recomputed in backward (full recomputation).
    Recompute {
        layer: u32,
        mb: u32,
    },
    /// Softmax probabilities recomputed in backward (selective recomputation).
    Scores {
        layer: u32,
        mb: u32,
    },
    /// ZB-H1: a layer's output gradients kept for its deferred weight passes.
    WeightGrad {
        layer: u32,
        mb: u32,
    },
    /// The head's saved state.
    Head {
        mb: u32,
    },
    /// A pipeline message buffer.
    Msg {
        send: bool,
        kind: P2pKind,
        vstage: u32,
        mb: u32,
    },
    /// ZeRO-3: a bucket's gathered parameters.
    Gathered {
        chunk: u32,
        bucket: u32,
        mb: u32,
    },
    /// ZeRO-2/3: a bucket's full gradient for one microbatch.
    GradBucket {
        chunk: u32,
        bucket: u32,
        mb: u32,
    },
    /// The tensors one pass of (chunk, microbatch) hands between its pieces.
    Work {
        chunk: u32,
        mb: u32,
    },
    /// Context parallelism: an exchange buffer of a layer's attention (`super::cp`).
    Cp {
        layer: u32,
        mb: u32,
        role: super::cp::CpRole,
    },
}

fn num(word: Option<&str>, prefix: &str) -> Option<u32> {
    word?.strip_prefix(prefix)?.parse().ok()
}

impl BufKey {
    /// Parses a buffer name as `strata_models::plan::lower` writes it.
    pub fn parse(name: &str) -> Option<BufKey> {
        let w: Vec<&str> = name.split_whitespace().collect();
        let at = |i: usize| w.get(i).copied();
        Some(match (at(0)?, w.len()) {
            ("params", 2) => BufKey::Params { chunk: num(at(1), "c")? },
            ("grads", 2) => BufKey::Grads { chunk: num(at(1), "c")? },
            ("optimizer", 2) => BufKey::Optimizer { chunk: num(at(1), "c")? },
            ("embed", 3) if at(1)? == "grad" => BufKey::EmbedGrad { mb: num(at(2), "mb")? },
            ("embed", 2) => BufKey::Embed { mb: num(at(1), "mb")? },
            ("head", 2) => BufKey::Head { mb: num(at(1), "mb")? },
            ("act", 3) => BufKey::Act { layer: num(at(1), "L")?, mb: num(at(2), "mb")? },
            ("recompute", 3) => BufKey::Recompute { layer: num(at(1), "L")?, mb: num(at(2), "mb")? },
            ("scores", 3) => BufKey::Scores { layer: num(at(1), "L")?, mb: num(at(2), "mb")? },
            ("work", 3) => BufKey::Work { chunk: num(at(1), "c")?, mb: num(at(2), "mb")? },
            ("wgrad", 3) => BufKey::WeightGrad { layer: num(at(1), "L")?, mb: num(at(2), "mb")? },
            ("recv" | "send", 4) => BufKey::Msg {
                send: at(0)? == "send",
                kind: match at(1)? {
                    "act" => P2pKind::Activation,
                    "grad" => P2pKind::Gradient,
                    _ => return None,
                },
                vstage: num(at(2), "vs")?,
                mb: num(at(3), "mb")?,
            },
            ("gathered", 4) => {
                BufKey::Gathered { chunk: num(at(1), "c")?, bucket: num(at(2), "b")?, mb: num(at(3), "mb")? }
            }
            ("cp", 4) => {
                BufKey::Cp { role: super::cp::CpRole::parse(at(1)?)?, layer: num(at(2), "L")?, mb: num(at(3), "mb")? }
            }
            ("grad", 5) if at(1)? == "bucket" => {
                BufKey::GradBucket { chunk: num(at(2), "c")?, bucket: num(at(3), "b")?, mb: num(at(4), "mb")? }
            }
            _ => return None,
        })
    }

    /// Buffers that live across steps.
    pub fn persistent(&self) -> bool {
        matches!(self, BufKey::Params { .. } | BufKey::Grads { .. } | BufKey::Optimizer { .. })
    }
}

/// A live plan buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub class: BufClass,
    /// Bytes the plan predicts.
    pub predicted: u64,
    pub key: BufKey,
}

/// The live plan buffers of one rank.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    pub live: BTreeMap<BufId, Slot>,
}

impl Pool {
    pub fn key(&self, buf: BufId) -> Option<BufKey> {
        self.live.get(&buf).map(|s| s.key)
    }

    /// Σ predicted bytes of the live buffers.
    pub fn predicted_bytes(&self) -> u64 {
        self.live.values().map(|s| s.predicted).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_the_lowering_writes_parses() {
        let cases = [
            ("params c1", BufKey::Params { chunk: 1 }),
            ("act L3 mb1", BufKey::Act { layer: 3, mb: 1 }),
            ("scores L0 mb7", BufKey::Scores { layer: 0, mb: 7 }),
            ("recv act vs2 mb5", BufKey::Msg { send: false, kind: P2pKind::Activation, vstage: 2, mb: 5 }),
            ("send grad vs1 mb0", BufKey::Msg { send: true, kind: P2pKind::Gradient, vstage: 1, mb: 0 }),
            ("gathered c0 b3 mb2", BufKey::Gathered { chunk: 0, bucket: 3, mb: 2 }),
            ("grad bucket c1 b0 mb4", BufKey::GradBucket { chunk: 1, bucket: 0, mb: 4 }),
            ("cp dkv1 L2 mb3", BufKey::Cp { layer: 2, mb: 3, role: super::super::cp::CpRole::Dkv(1) }),
            ("cp qkv-heads L0 mb1", BufKey::Cp { layer: 0, mb: 1, role: super::super::cp::CpRole::QkvHeads }),
        ];
        for (name, key) in cases {
            assert_eq!(BufKey::parse(name), Some(key), "{name}");
        }
        assert_eq!(BufKey::parse("act L3"), None);
        assert_eq!(BufKey::parse("mystery c0"), None);
    }
}
