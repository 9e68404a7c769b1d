//! A rank's model sizes: its shard's widths for a microbatch, and the widths the pieces'
//! kernels derive from them (Llama's GQA and SwiGLU, sequence parallelism's row shard).

/// The model's sizes on this rank.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub s: usize,
    /// Tokens of a microbatch, b·s.
    pub t: usize,
    /// Tokens of the microbatch this rank's norms and residual stream hold: its sequence
    /// shard, T / tp, under sequence parallelism (`sp`); all T otherwise.
    pub rows: usize,
    pub h: usize,
    /// Local query heads and key/value heads (fewer under grouped-query attention).
    pub heads: usize,
    pub kv: usize,
    pub hd: usize,
    pub f: usize,
    /// Vocabulary rows held, and the first one's id.
    pub v: usize,
    pub v0: usize,
    /// A Llama block (RMSNorm, SwiGLU, RoPE, no biases, untied output layer), and its
    /// rotary base.
    pub llama: bool,
    pub rope_base: f32,
}

impl Dims {
    /// A rank's dimensions from its shard's, for microbatches of `batch` sequences of `seq`.
    pub fn new(d: &crate::shard::ShardDims, batch: usize, seq: usize) -> Dims {
        Dims {
            b: batch,
            s: seq,
            t: batch * seq,
            rows: batch * seq,
            h: d.hidden,
            heads: d.heads,
            kv: d.kv_heads,
            hd: d.head_dim,
            f: d.ffn,
            v: d.vocab,
            v0: d.vocab_start,
            llama: d.llama,
            rope_base: d.rope_base as f32,
        }
    }

    /// Local query channels D = heads · head_dim.
    pub fn q_dim(&self) -> usize {
        self.heads * self.hd
    }
    /// Local key (or value) channels Dkv = kv · head_dim.
    pub fn kv_dim(&self) -> usize {
        self.kv * self.hd
    }
    /// Width of a token's row of the fused QKV projection, [Q | K | V]: D + 2·Dkv.
    pub fn qkv_w(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
    /// Width of FC1's output: [gate | up] (2F) for SwiGLU, F for GELU.
    pub fn fc1_w(&self) -> usize {
        if self.llama { 2 * self.f } else { self.f }
    }
}
