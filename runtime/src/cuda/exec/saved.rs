//! The blocks of saved state the plan's buffers hold on the GPU: a layer's activations in
//! its `act L mb` block (what it keeps under the plan's recomputation) or in full
//! recomputation's `recompute L mb`, and the head's in `head mb` — each tensor at a
//! 256-byte offset (bf16 tensors, fp32 statistics), shapes for T = b·s tokens of a
//! microbatch on this tensor-parallel rank. Under sequence parallelism the tensors of the
//! norms and the residual stream (r_in, r_mid, the norms' outputs a, m, hn and their
//! statistics) hold the rank's sequence shard only, `Dims::rows` = T / tp tokens, as the
//! CPU executor's `keep_rows` does; the column-parallel pieces' (qkv, ctx, the
//! attention's statistics, FC1's, the logits) hold all T tokens of the rank's columns.

use strata_models::Recompute;

use super::device::Ptr;

/// Offsets at 256-byte alignment inside one block.
struct Carve {
    base: Ptr,
    at: u64,
}

impl Carve {
    fn take(&mut self, bytes: usize) -> Ptr {
        let p = self.base + self.at;
        self.at += (bytes as u64).div_ceil(256) * 256;
        p
    }
}

/// A layer's saved activations, as addresses in its block (bf16 tensors, fp32 statistics).
pub struct Acts {
    pub r_in: Ptr,
    pub ln1_mean: Ptr,
    pub ln1_rstd: Ptr,
    pub a: Ptr,
    pub qkv: Ptr,
    pub ctx: Ptr,
    pub lse: Ptr,
    pub r_mid: Ptr,
    pub ln2_mean: Ptr,
    pub ln2_rstd: Ptr,
    pub m: Ptr,
    pub fc1_pre: Ptr,
    pub fc1_act: Ptr,
}

/// The block of a layer's activations at `base` (0: just its size), every tensor its
/// backward reads. A Llama block keeps no norm means (RMSNorm), a (T, D + 2·Dkv) qkv after
/// RoPE and a (T, 2F) [gate | up] FC1 output.
pub fn acts(d: &super::rank::Dims, base: Ptr) -> (Acts, u64) {
    carve_acts(d, base, true)
}

/// What a layer's `act L mb` block keeps under the plan's recomputation
/// (`accounting::memory::layer_activation_bytes`): everything (`none`); everything but the
/// attention's log-sum-exp statistics, the flash form of the scores (`selective`: the
/// backward recomputes them, `backward`); only the layer's input r_in (`full`: the other
/// addresses are null, and the backward reads the `recompute L mb` block instead).
pub fn saved_acts(d: &super::rank::Dims, base: Ptr, rc: Recompute) -> (Acts, u64) {
    match rc {
        Recompute::None => carve_acts(d, base, true),
        Recompute::Selective => carve_acts(d, base, false),
        Recompute::Full => {
            let mut c = Carve { base, at: 0 };
            let r_in = c.take(2 * d.rows * d.h);
            let a = Acts {
                r_in,
                ln1_mean: 0,
                ln1_rstd: 0,
                a: 0,
                qkv: 0,
                ctx: 0,
                lse: 0,
                r_mid: 0,
                ln2_mean: 0,
                ln2_rstd: 0,
                m: 0,
                fc1_pre: 0,
                fc1_act: 0,
            };
            (a, c.at)
        }
    }
}

fn carve_acts(d: &super::rank::Dims, base: Ptr, lse: bool) -> (Acts, u64) {
    // All tokens (column-parallel tensors), and the rank's rows of the residual stream.
    let (tk, rows, h, f) = (d.t, d.rows, d.h, d.f);
    let mut c = Carve { base, at: 0 };
    let mean = |c: &mut Carve| if d.llama { 0 } else { c.take(4 * rows) };
    let r_in = c.take(2 * rows * h);
    let ln1_mean = mean(&mut c);
    let a = Acts {
        r_in,
        ln1_mean,
        ln1_rstd: c.take(4 * rows),
        a: c.take(2 * rows * h),
        qkv: c.take(2 * tk * d.qkv_w()),
        ctx: c.take(2 * tk * d.q_dim()),
        lse: if lse { c.take(4 * d.b * d.heads * d.s) } else { 0 },
        r_mid: c.take(2 * rows * h),
        ln2_mean: mean(&mut c),
        ln2_rstd: c.take(4 * rows),
        m: c.take(2 * rows * h),
        fc1_pre: c.take(2 * tk * d.fc1_w()),
        fc1_act: c.take(2 * tk * f),
    };
    (a, c.at)
}

/// The head's saved state of a microbatch.
pub struct HeadActs {
    pub r_in: Ptr,
    pub mean: Ptr,
    pub rstd: Ptr,
    pub hn: Ptr,
    pub logits: Ptr,
    pub lse: Ptr,
    pub loss: Ptr,
}

pub fn head_acts(d: &super::rank::Dims, base: Ptr) -> (HeadActs, u64) {
    let (tk, rows, h) = (d.t, d.rows, d.h);
    let mut c = Carve { base, at: 0 };
    let r_in = c.take(2 * rows * h);
    let a = HeadActs {
        r_in,
        mean: if d.llama { 0 } else { c.take(4 * rows) },
        rstd: c.take(4 * rows),
        hn: c.take(2 * rows * h),
        logits: c.take(2 * tk * d.v),
        lse: c.take(4 * tk),
        loss: c.take(4 * tk),
    };
    (a, c.at)
}
