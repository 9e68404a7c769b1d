//! The rank grid: tp × dp × pp ranks, ordered `tp-dp-pp` (tensor-parallel rank fastest,
//! then data, then pipeline, as Megatron-LM orders them), every process group a slice of it,
//! and the placement of ranks on nodes.
//!
//! rank = tp_rank + tp · (dp_rank + dp · pp_rank).
//!
//! Worked example, tp = 2, dp = 2, pp = 2 (8 ranks): 4 tensor-parallel groups [0, 1],
//! [2, 3], [4, 5], [6, 7]; 4 data-parallel groups [0, 2], [1, 3], [4, 6], [5, 7]; pipelines
//! [0, 4], [1, 5], [2, 6], [3, 7]. Placement is contiguous: rank r runs on node
//! r / gpus_per_node, local GPU r mod gpus_per_node, so tensor-parallel groups (tp ≤
//! gpus_per_node) never leave a node and local GPU i drives rail i.
//!
//! The virtual pipeline ([`Pipeline`]): each of the pp stages holds vpp model chunks
//! (Megatron-LM's interleaved schedule); chunk c of stage i is virtual stage
//!
//!   v = c · pp + i,   so c = v / pp and i = v mod pp,
//!
//! and the model's layers run through virtual stages 0 … vpp · pp − 1 in order. Worked
//! example, pp = 2, vpp = 2: stage 0 holds virtual stages 0 and 2, stage 1 holds 1 and 3.

use serde::{Deserialize, Serialize};

use crate::plan::ir::{GroupKind, Peer};

/// The virtual pipeline: `pp` stages of `vpp` model chunks each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    pub pp: u32,
    pub vpp: u32,
}

impl Pipeline {
    pub fn new(pp: u32, vpp: u32) -> Pipeline {
        assert!(pp > 0 && vpp > 0, "pipeline of {pp} stages × {vpp} chunks");
        Pipeline { pp, vpp }
    }

    /// Number of virtual stages, vpp · pp.
    pub fn vstages(&self) -> u32 {
        // Saturating: a plan read from outside may hold any pp and vpp; the split rules
        // (every chunk needs a layer) then refuse it instead of a wrapped count.
        self.vpp.saturating_mul(self.pp)
    }

    /// The virtual stage of chunk `chunk` on pipeline stage `stage`: chunk · pp + stage.
    pub fn vstage(&self, chunk: u32, stage: u32) -> u32 {
        debug_assert!(chunk < self.vpp && stage < self.pp, "chunk {chunk} of stage {stage} in {self:?}");
        chunk * self.pp + stage
    }

    /// The (chunk, stage) that runs virtual stage `vstage`: (vstage / pp, vstage mod pp).
    pub fn chunk_and_stage(&self, vstage: u32) -> (u32, u32) {
        debug_assert!(vstage < self.vstages(), "virtual stage {vstage} in {self:?}");
        (vstage / self.pp, vstage % self.pp)
    }

    /// The last virtual stage, vpp · pp − 1: the one that runs the head.
    pub fn last_vstage(&self) -> u32 {
        self.vstages() - 1
    }
}

/// Coordinates of a rank in the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Coord {
    pub tp: u32,
    /// Context-parallel rank (0 when cp = 1).
    #[serde(default)]
    pub cp: u32,
    pub dp: u32,
    pub pp: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The rank grid and its placement.
///
/// With context and expert parallelism the order is Megatron-core's `tp-cp-ep-dp-pp`:
/// rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank)). Expert parallelism
/// does not add ranks: with experts not tensor-parallel (expert-tp = 1), a stage's
/// tp · cp · dp ranks, in rank order, are re-read as ep · (tp · cp · dp / ep): the
/// expert-parallel group of a rank is the block of `ep` consecutive ranks of its stage that
/// holds it, and its expert-data-parallel group the ranks of its stage at the same position
/// of their blocks. Worked example, tp = 2, cp = 1, dp = 4, pp = 1, ep = 4: expert-parallel
/// groups [0, 1, 2, 3] and [4, 5, 6, 7]; expert-data-parallel groups [0, 4], [1, 5], [2, 6],
/// [3, 7].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankGrid {
    pub tp: u32,
    pub dp: u32,
    pub pp: u32,
    pub gpus_per_node: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cp: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: u32,
}

impl RankGrid {
    pub fn new(tp: u32, dp: u32, pp: u32, gpus_per_node: u32) -> RankGrid {
        assert!(tp > 0 && dp > 0 && pp > 0 && gpus_per_node > 0, "grid {tp}×{dp}×{pp} on {gpus_per_node}-GPU nodes");
        RankGrid { tp, dp, pp, gpus_per_node, cp: 1, ep: 1 }
    }

    /// The same grid with `cp` context-parallel and `ep` expert-parallel ranks (ep divides
    /// tp · cp · dp; the split's rules check it first).
    pub fn with_cp_ep(self, cp: u32, ep: u32) -> RankGrid {
        assert!(cp > 0 && ep > 0, "cp {cp}, ep {ep}");
        debug_assert!((self.tp * cp * self.dp).is_multiple_of(ep), "ep {ep} divides tp·cp·dp");
        RankGrid { cp, ep, ..self }
    }

    pub fn ranks(&self) -> u32 {
        self.stage_ranks() * self.pp
    }

    pub fn coord(&self, rank: u32) -> Coord {
        debug_assert!(rank < self.ranks());
        Coord {
            tp: rank % self.tp,
            cp: (rank / self.tp) % self.cp,
            dp: (rank / (self.tp * self.cp)) % self.dp,
            pp: rank / self.stage_ranks(),
        }
    }

    pub fn rank(&self, c: Coord) -> u32 {
        debug_assert!(c.tp < self.tp && c.cp < self.cp && c.dp < self.dp && c.pp < self.pp);
        c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))
    }

    /// Index of `rank` within its pipeline stage, tp_rank + tp · (cp_rank + cp · dp_rank).
    fn in_stage(&self, rank: u32) -> u32 {
        rank % self.stage_ranks()
    }

    /// The members of `rank`'s group of a kind, in group order (the order NCCL ranks them).
    pub fn group(&self, rank: u32, kind: GroupKind) -> Vec<u32> {
        let c = self.coord(rank);
        match kind {
            GroupKind::Tp => (0..self.tp).map(|tp| self.rank(Coord { tp, ..c })).collect(),
            GroupKind::Cp => (0..self.cp).map(|cp| self.rank(Coord { cp, ..c })).collect(),
            GroupKind::Dp => (0..self.dp)
                .flat_map(|dp| (0..self.cp).map(move |cp| (cp, dp)))
                .map(|(cp, dp)| self.rank(Coord { cp, dp, ..c }))
                .collect(),
            GroupKind::Ep => {
                let base = rank - self.in_stage(rank) % self.ep;
                (base..base + self.ep).collect()
            }
            GroupKind::ExpertDp => {
                let stage = rank - self.in_stage(rank);
                let pos = self.in_stage(rank) % self.ep;
                (0..self.stage_ranks() / self.ep).map(|i| stage + pos + i * self.ep).collect()
            }
            GroupKind::Embedding => {
                let mut g = vec![self.rank(Coord { pp: 0, ..c })];
                if self.pp > 1 {
                    g.push(self.rank(Coord { pp: self.pp - 1, ..c }));
                }
                g
            }
            GroupKind::World => (0..self.ranks()).collect(),
        }
    }

    /// Members of every group of a kind: tp; cp; cp · dp for the data-parallel group (the
    /// ranks that hold a dense parameter's replicas); ep; tp · cp · dp / ep for the
    /// expert-data-parallel group; 2 for the embedding group (first and last stage; 1 when
    /// pp = 1, where they are the same stage), every rank for the world.
    pub fn group_size(&self, kind: GroupKind) -> u32 {
        match kind {
            GroupKind::Tp => self.tp,
            GroupKind::Cp => self.cp,
            GroupKind::Dp => self.cp * self.dp,
            GroupKind::Ep => self.ep,
            GroupKind::ExpertDp => self.stage_ranks() / self.ep,
            GroupKind::Embedding => 1 + u32::from(self.pp > 1),
            GroupKind::World => self.ranks(),
        }
    }

    /// Ranks that run one pipeline stage, tp · cp · dp.
    pub fn stage_ranks(&self) -> u32 {
        self.tp * self.cp * self.dp
    }

    /// Number of distinct groups of a kind, and the index of `rank`'s group among them.
    pub fn group_id(&self, rank: u32, kind: GroupKind) -> (u32, u32) {
        let c = self.coord(rank);
        let j = self.in_stage(rank);
        match kind {
            GroupKind::Tp => (self.cp * self.dp * self.pp, c.cp + self.cp * (c.dp + self.dp * c.pp)),
            GroupKind::Cp => (self.tp * self.dp * self.pp, c.tp + self.tp * (c.dp + self.dp * c.pp)),
            GroupKind::Dp => (self.tp * self.pp, c.tp + self.tp * c.pp),
            GroupKind::Ep => {
                let per_stage = self.stage_ranks() / self.ep;
                (per_stage * self.pp, j / self.ep + per_stage * c.pp)
            }
            GroupKind::ExpertDp => (self.ep * self.pp, j % self.ep + self.ep * c.pp),
            GroupKind::Embedding => (self.stage_ranks(), j),
            GroupKind::World => (1, 0),
        }
    }

    /// Position of `rank` within its group of a kind.
    pub fn position(&self, rank: u32, kind: GroupKind) -> u32 {
        let c = self.coord(rank);
        match kind {
            GroupKind::Tp => c.tp,
            GroupKind::Cp => c.cp,
            GroupKind::Dp => c.cp + self.cp * c.dp,
            GroupKind::Ep => self.in_stage(rank) % self.ep,
            GroupKind::ExpertDp => self.in_stage(rank) / self.ep,
            GroupKind::Embedding => u32::from(c.pp != 0),
            GroupKind::World => rank,
        }
    }

    /// The neighbouring pipeline rank, in ring order over stages.
    pub fn peer(&self, rank: u32, peer: Peer) -> u32 {
        let c = self.coord(rank);
        let pp = match peer {
            Peer::Next => (c.pp + 1) % self.pp,
            Peer::Prev => (c.pp + self.pp - 1) % self.pp,
        };
        self.rank(Coord { pp, ..c })
    }

    /// (node, local GPU) of a rank.
    pub fn placement(&self, rank: u32) -> (u32, u32) {
        (rank / self.gpus_per_node, rank % self.gpus_per_node)
    }

    /// `TP(2)-PP(2)-DP(4)-rank(3)`; `TP(2)-CP(2)-EP(4)-PP(2)-DP(4)-rank(3)` with context or
    /// expert parallelism.
    pub fn label(&self, rank: u32) -> String {
        format!("{self}-rank({rank})")
    }
}

impl std::fmt::Display for RankGrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TP({})", self.tp)?;
        if self.cp > 1 {
            write!(f, "-CP({})", self.cp)?;
        }
        if self.ep > 1 {
            write!(f, "-EP({})", self.ep)?;
        }
        write!(f, "-PP({})-DP({})", self.pp, self.dp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_and_groups() {
        let g = RankGrid::new(2, 2, 2, 8);
        assert_eq!(g.group(3, GroupKind::Tp), vec![2, 3]);
        assert_eq!(g.group(3, GroupKind::Dp), vec![1, 3]);
        assert_eq!(g.group(1, GroupKind::Embedding), vec![1, 5]);
        assert_eq!(g.peer(1, Peer::Next), 5);
        assert_eq!(g.peer(1, Peer::Prev), 5);
        assert_eq!(g.coord(6), Coord { tp: 0, cp: 0, dp: 1, pp: 1 });
        assert_eq!(g.label(3), "TP(2)-PP(2)-DP(2)-rank(3)");
        for r in 0..8 {
            assert_eq!(g.rank(g.coord(r)), r);
            for kind in [GroupKind::Tp, GroupKind::Dp, GroupKind::Embedding] {
                let members = g.group(r, kind);
                assert_eq!(members.len() as u32, g.group_size(kind));
                assert_eq!(members[g.position(r, kind) as usize], r);
                // Every member of a group agrees on the group's id.
                let id = g.group_id(r, kind);
                assert!(members.iter().all(|m| g.group_id(*m, kind) == id));
            }
        }
    }

    #[test]
    fn group_sizes() {
        let g = RankGrid::new(4, 3, 2, 8);
        assert_eq!(g.group_size(GroupKind::World), 24);
        assert_eq!(g.group(5, GroupKind::World).len(), 24);
        assert_eq!(g.group_size(GroupKind::Embedding), 2);
        assert_eq!(RankGrid::new(4, 3, 1, 8).group_size(GroupKind::Embedding), 1);
        assert_eq!(RankGrid::new(4, 3, 1, 8).group(5, GroupKind::Embedding), vec![5]);
        assert_eq!(g.stage_ranks(), 12);
    }

    #[test]
    fn virtual_stages() {
        // pp = 2, vpp = 2: stage 0 holds virtual stages 0 and 2, stage 1 holds 1 and 3.
        let p = Pipeline::new(2, 2);
        assert_eq!((p.vstage(0, 0), p.vstage(0, 1), p.vstage(1, 0), p.vstage(1, 1)), (0, 1, 2, 3));
        assert_eq!(p.last_vstage(), 3);
        let p = Pipeline::new(4, 3);
        for v in 0..p.vstages() {
            let (c, i) = p.chunk_and_stage(v);
            assert_eq!(p.vstage(c, i), v);
        }
        assert_eq!(p.chunk_and_stage(p.last_vstage()), (2, 3));
    }

    #[test]
    fn groups_partition_the_ranks() {
        let g = RankGrid::new(4, 3, 2, 8);
        for kind in [GroupKind::Tp, GroupKind::Dp] {
            let (count, _) = g.group_id(0, kind);
            let mut seen = vec![0; g.ranks() as usize];
            for r in 0..g.ranks() {
                seen[r as usize] += 1;
                assert!(g.group_id(r, kind).1 < count);
            }
            assert!(seen.iter().all(|s| *s == 1));
        }
        assert_eq!(g.placement(13), (1, 5));
    }

    #[test]
    fn context_and_expert_groups() {
        // tp 2, cp 2, dp 2, pp 2: 16 ranks; ep 4 over a stage's 8 ranks.
        let g = RankGrid::new(2, 2, 2, 8).with_cp_ep(2, 4);
        assert_eq!(g.ranks(), 16);
        assert_eq!(g.coord(5), Coord { tp: 1, cp: 0, dp: 1, pp: 0 });
        assert_eq!(g.group(5, GroupKind::Tp), vec![4, 5]);
        assert_eq!(g.group(5, GroupKind::Cp), vec![5, 7]);
        // Dense gradients reduce over cp · dp.
        assert_eq!(g.group(5, GroupKind::Dp), vec![1, 3, 5, 7]);
        assert_eq!(g.group(5, GroupKind::Ep), vec![4, 5, 6, 7]);
        assert_eq!(g.group(13, GroupKind::Ep), vec![12, 13, 14, 15]);
        assert_eq!(g.group(5, GroupKind::ExpertDp), vec![1, 5]);
        assert_eq!(g.group(5, GroupKind::Embedding), vec![5, 13]);
        assert_eq!(g.label(3), "TP(2)-CP(2)-EP(4)-PP(2)-DP(2)-rank(3)");
        for r in 0..g.ranks() {
            assert_eq!(g.rank(g.coord(r)), r);
            for kind in
                [GroupKind::Tp, GroupKind::Cp, GroupKind::Dp, GroupKind::Ep, GroupKind::ExpertDp, GroupKind::Embedding]
            {
                let members = g.group(r, kind);
                assert_eq!(members.len() as u32, g.group_size(kind), "{kind:?}");
                assert_eq!(members[g.position(r, kind) as usize], r, "{kind:?} of {r}");
                let id = g.group_id(r, kind);
                assert!(id.1 < id.0);
                assert!(members.iter().all(|m| g.group_id(*m, kind) == id), "{kind:?} of {r}");
            }
        }
        // Every kind's groups partition the ranks.
        for kind in [GroupKind::Cp, GroupKind::Dp, GroupKind::Ep, GroupKind::ExpertDp] {
            let (count, _) = g.group_id(0, kind);
            assert_eq!(count * g.group_size(kind), g.ranks(), "{kind:?}");
        }
    }
}
