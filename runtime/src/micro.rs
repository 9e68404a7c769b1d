//! The shape of one microbatch, shared by the data loader and the layers.
//!
//! A leaf module: it uses no other module of the crate, so [`crate::data`] (which cuts
//! batches to this shape) and [`crate::shard`] (whose layers run on it) both depend on it
//! without depending on each other.

/// One microbatch's shape: `batch` sequences of `seq` tokens, flattened to T = batch·seq
/// rows; row i holds position i mod seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Micro {
    pub batch: usize,
    pub seq: usize,
}

impl Micro {
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
}
