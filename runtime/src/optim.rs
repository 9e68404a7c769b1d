//! AdamW on a flat parameter shard, and gradient-norm clipping in two halves.
//!
//! AdamW (Loshchilov & Hutter 2019) with bias correction, per element, at step k ≥ 1:
//!
//! ```text
//! m ← β1·m + (1 − β1)·g          m̂ = m / (1 − β1^k)
//! v ← β2·v + (1 − β2)·g²         v̂ = v / (1 − β2^k)
//! θ ← θ − lr·( m̂ / (√v̂ + ε) + λ·θ )      (λ only on decayed tensors: matrices and tables)
//! ```
//!
//! β1 = 0.9, β2 = 0.95, ε = 1e-8 (GPT-3). The optimizer owns the moments of one
//! [`ZeroShard`] of a chunk's flat buffer (llm.c's (offset, size) ZeRO shard; Rajbhandari et
//! al. 2020): without ZeRO the shard is the whole buffer; with ZeRO-1/2/3 each data-parallel
//! rank steps only its shard and the caller all-gathers the updated parameters.
//!
//! Clipping by the global norm is split so that the caller can all-reduce in between:
//! each rank computes a local Σg² (see `ParamLayout::grad_sq_sum`, which counts replicated
//! tensors once), the caller sums over the groups, then every rank scales by
//! [`clip_scale`] = min(1, max_norm / ‖g‖).

use std::ops::Range;

use crate::error::RuntimeError;
use crate::tensor::F32_BYTES;

/// The part of a flat buffer that one data-parallel rank owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroShard {
    pub offset: usize,
    pub size: usize,
}

impl ZeroShard {
    /// The whole buffer (no ZeRO).
    pub fn whole(len: usize) -> ZeroShard {
        ZeroShard { offset: 0, size: len }
    }

    /// Shard `rank` of `ranks` near-equal contiguous parts of a buffer of `len` elements:
    /// the first len mod ranks shards get one extra element.
    /// Example: len 10 over 4 ranks → sizes 3, 3, 2, 2 at offsets 0, 3, 6, 8.
    pub fn split(len: usize, rank: usize, ranks: usize) -> Result<ZeroShard, RuntimeError> {
        if ranks == 0 || rank >= ranks {
            return Err(RuntimeError::BadSetting(format!(
                "ZeRO shard {rank} of {ranks}: ranks run from 0 to size − 1"
            )));
        }
        let (base, extra) = (len / ranks, len % ranks);
        let offset = rank * base + rank.min(extra);
        Ok(ZeroShard { offset, size: base + usize::from(rank < extra) })
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.size
    }
}

/// AdamW hyper-parameters. `lr` may change every step (schedules are the caller's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 3e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }
    }
}

/// AdamW state for one shard: first and second moments and the step count.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub shard: ZeroShard,
    pub m: Vec<f32>, // (shard.size)
    pub v: Vec<f32>, // (shard.size)
    /// Steps taken so far (the k of the bias correction is step + 1 during a step).
    pub step: u64,
}

impl AdamW {
    pub fn new(shard: ZeroShard) -> AdamW {
        AdamW { shard, m: vec![0.0; shard.size], v: vec![0.0; shard.size], step: 0 }
    }

    /// Bytes of optimizer state (both moments).
    pub fn state_bytes(&self) -> usize {
        (self.m.len() + self.v.len()) * F32_BYTES
    }

    /// One update of the shard. `params` and `grads` are the shard's elements
    /// (`shard.size` each); `decay` lists the decayed ranges in whole-buffer coordinates
    /// (`ParamLayout::decay_ranges`).
    pub fn update(&mut self, cfg: &AdamWConfig, params: &mut [f32], grads: &[f32], decay: &[Range<usize>]) {
        let n = self.shard.size;
        assert!(
            params.len() == n && grads.len() == n,
            "AdamW: shard of {n} elements, got {} / {}",
            params.len(),
            grads.len()
        );
        self.step += 1;
        // β^k underflows to 0 long before k leaves i32, so saturating is exact enough.
        let k = self.step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - cfg.beta1.powi(k);
        let bc2 = 1.0 - cfg.beta2.powi(k);
        // Walk the shard in runs that are entirely decayed or entirely not.
        let mut cuts: Vec<usize> = vec![0, n];
        for r in decay {
            for edge in [r.start, r.end] {
                if edge > self.shard.offset && edge < self.shard.offset + n {
                    cuts.push(edge - self.shard.offset);
                }
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        for w in cuts.windows(2) {
            let global = self.shard.offset + w[0];
            let wd = if decay.iter().any(|r| r.contains(&global)) { cfg.weight_decay } else { 0.0 };
            for i in w[0]..w[1] {
                let g = grads[i];
                let m = cfg.beta1 * self.m[i] + (1.0 - cfg.beta1) * g;
                let v = cfg.beta2 * self.v[i] + (1.0 - cfg.beta2) * g * g;
                self.m[i] = m;
                self.v[i] = v;
                let (m_hat, v_hat) = (m / bc1, v / bc2);
                params[i] -= cfg.lr * (m_hat / (v_hat.sqrt() + cfg.eps) + wd * params[i]);
            }
        }
    }
}

/// The factor min(1, max_norm / ‖g‖) that clips the global gradient norm, given the
/// all-reduced Σg². Returns 1 when max_norm ≤ 0 (clipping off).
pub fn clip_scale(total_sq_sum: f64, max_norm: f32) -> f32 {
    let norm = total_sq_sum.sqrt();
    if max_norm > 0.0 && norm > max_norm as f64 { (max_norm as f64 / (norm + 1e-6)) as f32 } else { 1.0 }
}

/// g ← s·g.
pub fn scale_in_place(grads: &mut [f32], s: f32) {
    if s != 1.0 {
        grads.iter_mut().for_each(|g| *g *= s);
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // decay lists of one range
mod tests {
    use super::*;

    #[test]
    fn zero_shards_tile_the_buffer() {
        let shards: Vec<_> = (0..4).map(|r| ZeroShard::split(10, r, 4).unwrap()).collect();
        assert_eq!(shards.iter().map(|s| (s.offset, s.size)).collect::<Vec<_>>(), vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
        assert!(ZeroShard::split(10, 4, 4).is_err());
    }

    #[test]
    fn first_step_moves_each_parameter_by_lr_against_the_gradient_sign() {
        // At k = 1, m̂ = g and v̂ = g², so the Adam step is lr·g/(|g| + ε) ≈ lr·sign(g).
        let cfg = AdamWConfig { lr: 0.1, weight_decay: 0.0, ..AdamWConfig::default() };
        let mut opt = AdamW::new(ZeroShard::whole(3));
        let mut p = vec![1.0, 1.0, 1.0];
        opt.update(&cfg, &mut p, &[2.0, -0.5, 0.0], &[]);
        assert!((p[0] - 0.9).abs() < 1e-6 && (p[1] - 1.1).abs() < 1e-6 && p[2] == 1.0, "{p:?}");
        assert_eq!(opt.step, 1);
    }

    #[test]
    fn weight_decay_applies_only_inside_decay_ranges_in_global_coordinates() {
        let cfg = AdamWConfig { lr: 0.1, weight_decay: 0.5, ..AdamWConfig::default() };
        // The shard covers global elements 4..8; elements 6..10 decay.
        let mut opt = AdamW::new(ZeroShard { offset: 4, size: 4 });
        let mut p = vec![2.0; 4];
        opt.update(&cfg, &mut p, &[0.0; 4], &[6..10]);
        assert_eq!(p, vec![2.0, 2.0, 2.0 - 0.1 * 0.5 * 2.0, 2.0 - 0.1 * 0.5 * 2.0]);
    }

    #[test]
    fn sharded_updates_equal_the_whole_update() {
        let n = 11;
        let grads: Vec<f32> = (0..n).map(|i| (i as f32 - 5.0) * 0.3).collect();
        let cfg = AdamWConfig { lr: 0.01, ..AdamWConfig::default() };
        let decay = [2..7];
        let mut whole = vec![0.5f32; n];
        let mut opt = AdamW::new(ZeroShard::whole(n));
        let mut parts = whole.clone();
        let mut opts: Vec<_> = (0..3).map(|r| AdamW::new(ZeroShard::split(n, r, 3).unwrap())).collect();
        for _ in 0..3 {
            opt.update(&cfg, &mut whole, &grads, &decay);
            for o in &mut opts {
                let r = o.shard.range();
                o.update(&cfg, &mut parts[r.clone()], &grads[r], &decay);
            }
        }
        assert_eq!(whole, parts, "ZeRO shards must update exactly like the whole buffer");
    }

    #[test]
    fn clipping_bounds_the_norm() {
        let mut g = vec![3.0f32, 4.0];
        let s = clip_scale(25.0, 1.0);
        scale_in_place(&mut g, s);
        let norm = (g[0] * g[0] + g[1] * g[1]).sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(clip_scale(0.25, 1.0), 1.0);
        assert_eq!(clip_scale(1e6, 0.0), 1.0);
    }
}
