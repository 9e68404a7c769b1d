//! The lowered plan: the boundary type between the planner and its backends (the
//! simulator, the runtime, the reports). A [`Plan`] holds the scenario it was lowered from,
//! the rank grid, the compute-cost table and one program per pipeline stage; [`Unit`]s are
//! the parameter groups ZeRO moves together and [`Bucket`]s the gradient buckets packed
//! from them. Plain data with serde, so a plan can be written out and read back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::grid::{Pipeline, RankGrid};
use crate::plan::ir::{ComputeCost, CostId, Program};
use crate::scenario::Scenario;

/// A group of parameters that moves together under ZeRO: a layer, or an embedding piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// The vocabulary-parallel word embedding (on the first stage, and its tied copy on the
    /// last stage when pp > 1). Always a bucket of its own, so both copies shard alike.
    WordEmbedding,
    /// Learned position embeddings (GPT).
    PosEmbedding,
    Layer(u32),
    /// The routed experts this rank holds of a mixture-of-experts layer (E/ep of them, not
    /// tensor-parallel). Packed into buckets of their own, reduced over the
    /// expert-data-parallel group (`CollPurpose::ExpertGradBucket`); ZeRO shards their state
    /// over that group. The layer's attention, norms, router and shared experts stay in
    /// `Layer`.
    Experts(u32),
    FinalNorm,
    /// An untied output layer (Llama).
    OutputLayer,
}

/// A gradient bucket: consecutive units of one model chunk, in backward order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub chunk: u32,
    pub index: u32,
    pub units: Vec<Unit>,
    /// Parameters per rank in the bucket, before ZeRO sharding.
    pub params: u64,
}

impl Bucket {
    /// A bucket of expert units: reduced and sharded over `GroupKind::ExpertDp`.
    pub fn is_expert(&self) -> bool {
        self.units.first().is_some_and(|u| matches!(u, Unit::Experts(_)))
    }
}

/// The lowered step: one program per pipeline stage, shared by every rank of the stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub scenario: Scenario,
    pub grid: RankGrid,
    pub costs: Vec<ComputeCost>,
    /// Host nanoseconds a compute op of each cost id adds beside its device time
    /// (DeepSpeed ZeRO-3's per-module hooks); empty when the framework adds none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ns: Vec<u64>,
    /// Gradient buckets per stage (outer) in emission order.
    pub buckets: Vec<Vec<Bucket>>,
    /// Distinct programs; the first `pp` are the stages' programs.
    pub programs: Vec<Program>,
    /// Ranks that run a program other than their stage's: rank → index into `programs`.
    /// Empty for every plan the planner emits (all ranks of a stage are alike); used by
    /// tools and tests that edit one rank.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rank_programs: BTreeMap<u32, u32>,
}

impl Plan {
    /// Index into `programs` of the program `rank` runs.
    pub fn program_index(&self, rank: u32) -> usize {
        match self.rank_programs.get(&rank) {
            Some(i) => *i as usize,
            None => self.grid.coord(rank).pp as usize,
        }
    }

    /// The program rank `rank` runs.
    pub fn program(&self, rank: u32) -> &Program {
        &self.programs[self.program_index(rank)]
    }

    /// Gives `rank` a program of its own (a copy of its current one) and returns it for
    /// editing.
    pub fn program_of_rank_mut(&mut self, rank: u32) -> &mut Program {
        let current = self.program_index(rank);
        if !self.rank_programs.contains_key(&rank) {
            self.programs.push(self.programs[current].clone());
            self.rank_programs.insert(rank, (self.programs.len() - 1) as u32);
        }
        let i = self.rank_programs[&rank] as usize;
        &mut self.programs[i]
    }

    pub fn cost(&self, id: CostId) -> &ComputeCost {
        &self.costs[id as usize]
    }

    /// Host nanoseconds an op of cost `id` adds (0 when the framework adds none).
    pub fn host_ns(&self, id: CostId) -> u64 {
        self.host_ns.get(id as usize).copied().unwrap_or(0)
    }

    /// Total ops over all distinct programs.
    pub fn op_count(&self) -> usize {
        self.programs.iter().map(|p| p.ops.len()).sum()
    }

    /// The virtual pipeline the programs run: pp stages of vpp chunks.
    pub fn pipeline(&self) -> Pipeline {
        self.scenario.parallel.pipeline()
    }

    /// Model width h: the last dimension of every activation, message and gradient.
    pub fn hidden(&self) -> u32 {
        self.scenario.model.hidden
    }

    /// Vocabulary size v: token ids run over 0..v.
    pub fn vocab(&self) -> u32 {
        self.scenario.model.vocab
    }

    /// Whether the programs split activations outside attention and the MLP along the
    /// sequence over the tensor-parallel group. Lowering validated the scenario, so then
    /// tp ≥ 2 and tp divides seq_len (and so micro_batch · seq_len).
    pub fn sequence_parallel(&self) -> bool {
        self.scenario.parallel.sequence_parallel
    }
}
