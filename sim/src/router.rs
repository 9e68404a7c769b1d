//! Router imbalance: how many tokens each expert of a MoE layer receives in one microbatch,
//! and what that does to the expert-parallel ranks.
//!
//! A plan's `Experts` ops and its dispatch/combine all-to-alls (`CollPurpose::Moe`) carry the
//! *balanced* expectation: every expert gets tokens·k / E rows. Real routers are not
//! balanced. Per (expert-parallel group, MoE layer, microbatch) this module draws the
//! experts' loads from the engine's seed — a ChaCha8 stream of its own per key, so a draw
//! does not depend on the order events ask for it, nor on any thread count — with a given
//! Gini coefficient of tokens over experts:
//! - E weights log-normal with σ = 2·erf⁻¹(G) (the log-normal whose Gini is G), then raised
//!   to the power p (regula falsi) that makes this draw's Gini G exactly — a power keeps the
//!   experts' order and positivity, and reaches any G below (E − 1)/E — and scaled to mean 1;
//! - with a capacity factor c (Megatron-LM's `--moe-expert-capacity-factor`, capacity =
//!   ⌈tokens·k / E · c⌉, moe_utils.py `get_capacity`) an expert keeps at most c × the
//!   balanced load, the rest dropped; without one the run is dropless (Megatron's default);
//! - EP rank r holds experts [r·E/ep, (r+1)·E/ep) (Megatron-core's contiguous local experts),
//!   and its load ÷ balanced is the mean of its experts' loads.
//!
//! The engine scales a rank's `Experts` compute (forward, backward, recompute — the same
//! routing) by its load ÷ balanced, and a dispatch's or combine's bytes by the most loaded
//! rank's (the all-to-all synchronises: the rank receiving most sets its pace). Symmetric
//! mode (one actor per stage) takes the maximum over every EP rank of the stage, so it
//! stands for the most loaded rank, which is the one the stage waits for.
//!
//! **Default skew** (`MoeSpec::skew` absent): the Gini measured on real routing of trained
//! MoE checkpoints, 0.105 for attention (MHA/GQA) models, and 0.24 for MLA models, which
//! stay above it (arXiv 2605.20982, DODOCO 2026, abstract: "Gini 0.105 (MHA) – 0.15
//! (Mamba-2) on wikitext, MLA/GDN models stay > 0.24"). `skew = 0` is the force-balanced
//! routing NVIDIA's Megatron-Bridge benchmarks publish (docs/performance-summary.md).

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_models::ModelSpec;
use strata_models::plan::{GroupKind, Plan, RankGrid};

/// Published Gini of tokens over experts on real routing, attention (MHA/GQA) models.
pub const DEFAULT_GINI: f64 = 0.105;
/// The same for multi-head latent attention models (a lower bound: "stay above 0.24").
pub const DEFAULT_GINI_MLA: f64 = 0.24;

/// The Gini a model's router is simulated with: its `skew`, else the published default.
pub fn model_gini(model: &ModelSpec) -> Option<f64> {
    let moe = model.moe.as_ref()?;
    Some(moe.skew.unwrap_or(if model.mla.is_some() { DEFAULT_GINI_MLA } else { DEFAULT_GINI }))
}

/// Gini coefficient of non-negative values: Σ_i Σ_j |x_i − x_j| / (2 n² mean).
pub fn gini(x: &[f64]) -> f64 {
    let mut s = x.to_vec();
    s.sort_by(f64::total_cmp);
    gini_sorted(&s)
}

/// [`gini`] of values sorted ascending: Σ_i (2i − n − 1)·x_(i) / (n·Σx), i = 1 … n.
fn gini_sorted(s: &[f64]) -> f64 {
    let n = s.len() as f64;
    let sum: f64 = s.iter().sum();
    if s.len() < 2 || sum <= 0.0 {
        return 0.0;
    }
    let w: f64 = s.iter().enumerate().map(|(i, v)| (2.0 * (i as f64 + 1.0) - n - 1.0) * v).sum();
    w / (n * sum)
}

/// erf(x), Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -y } else { y }
}

/// σ of the log-normal whose Gini is `g` (Gini = erf(σ/2)), by bisection.
fn lognormal_sigma(g: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 12.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if erf(mid / 2.0) < g { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// The experts' loads for one key of one run.
pub struct RouterLoads {
    experts: u32,
    ep: u32,
    gini: f64,
    capacity: Option<f64>,
    seed: u64,
    grid: RankGrid,
    /// Per (EP group, layer, microbatch): each EP position's load ÷ balanced, and the max.
    cache: BTreeMap<(u32, u32, u32), (Vec<f64>, f64)>,
}

impl RouterLoads {
    /// The loads of a plan's MoE layers under `seed`; `None` for a dense model.
    pub fn new(plan: &Plan, seed: u64) -> Option<RouterLoads> {
        let m = &plan.scenario.model;
        let moe = m.moe.as_ref()?;
        Some(RouterLoads::with(moe.experts, model_gini(m)?, moe.capacity_factor, seed, plan.grid))
    }

    /// The loads of `experts` experts split over `grid.ep` ranks, at Gini `gini`.
    pub fn with(experts: u32, gini: f64, capacity: Option<f64>, seed: u64, grid: RankGrid) -> RouterLoads {
        RouterLoads {
            experts: experts.max(1),
            ep: grid.ep.max(1),
            gini: if gini.is_finite() { gini.clamp(0.0, 1.0) } else { 0.0 },
            capacity: capacity.filter(|c| c.is_finite() && *c > 0.0),
            seed,
            grid,
            cache: BTreeMap::new(),
        }
    }

    /// Each expert's tokens ÷ the balanced share, before any capacity: mean 1, Gini exactly
    /// the target (or as close as non-negative loads allow).
    pub fn expert_loads(&self, group: u32, layer: u32, mb: u32) -> Vec<f64> {
        let e = self.experts as usize;
        if e < 2 || self.gini <= 0.0 {
            return vec![1.0; e];
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        // One stream per key (group < 2^32, layer and microbatch < 2^16 by the limits).
        rng.set_stream((u64::from(group) << 32) | (u64::from(layer & 0xffff) << 16) | u64::from(mb & 0xffff));
        let sigma = lognormal_sigma(self.gini);
        let mut x: Vec<f64> = (0..e)
            .map(|_| {
                // Box–Muller: u1 in (0, 1].
                let u1 = 1.0 - rng.random_range(0.0..1.0);
                let u2: f64 = rng.random_range(0.0..1.0);
                let z = (-2.0 * f64::ln(u1)).sqrt() * (std::f64::consts::TAU * u2).cos();
                (sigma * z).exp()
            })
            .collect();
        // x → x^p keeps the experts' order and signs and raises the Gini monotonically from 0
        // (p = 0) towards (E − 1)/E (one expert takes every token): bisect p for G exactly.
        // Scaled to a maximum of 1, so that x^p stays in [0, 1] for any p (no overflow).
        let top = x.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
        x.iter_mut().for_each(|v| *v /= top);
        let mut sorted = x.clone();
        sorted.sort_by(f64::total_cmp);
        let target = self.gini.min((e as f64 - 1.0) / e as f64 * (1.0 - 1e-9));
        let n = e as f64;
        let gini_at = |p: f64| {
            let (mut sum, mut w) = (0.0, 0.0);
            for (i, v) in sorted.iter().enumerate() {
                let y = v.powf(p);
                sum += y;
                w += (2.0 * (i as f64 + 1.0) - n - 1.0) * y;
            }
            w / (n * sum) - target
        };
        // Bracket the root, then the Illinois variant of regula falsi (a few evaluations).
        let (mut lo, mut hi) = (0.0, 1.0);
        let (mut flo, mut fhi) = (-target, gini_at(1.0));
        while fhi < 0.0 && hi < 1e6 {
            (lo, flo) = (hi, fhi);
            hi *= 2.0;
            fhi = gini_at(hi);
        }
        let mut p = hi;
        let mut side = 0;
        for _ in 0..200 {
            p = (lo * fhi - hi * flo) / (fhi - flo);
            let f = gini_at(p);
            if f.abs() < 1e-13 {
                break;
            }
            if f < 0.0 {
                (lo, flo) = (p, f);
                if side == -1 {
                    fhi /= 2.0;
                }
                side = -1;
            } else {
                (hi, fhi) = (p, f);
                if side == 1 {
                    flo /= 2.0;
                }
                side = 1;
            }
        }
        x.iter_mut().for_each(|v| *v = v.powf(p));
        let mean = x.iter().sum::<f64>() / e as f64;
        x.iter().map(|v| v / mean).collect()
    }

    /// Each EP position's load ÷ balanced in group `group` (after capacity), and the max.
    pub fn rank_loads(&mut self, group: u32, layer: u32, mb: u32) -> (&[f64], f64) {
        if !self.cache.contains_key(&(group, layer, mb)) {
            let mut x = self.expert_loads(group, layer, mb);
            if let Some(c) = self.capacity {
                x.iter_mut().for_each(|v| *v = v.min(c));
            }
            let (e, ep) = (x.len(), self.ep as usize);
            let ranks: Vec<f64> = (0..ep)
                .map(|r| {
                    let local = &x[r * e / ep..((r + 1) * e / ep).max(r * e / ep + 1).min(e)];
                    local.iter().sum::<f64>() / local.len() as f64
                })
                .collect();
            let max = ranks.iter().copied().fold(0.0, f64::max);
            self.cache.insert((group, layer, mb), (ranks, max));
        }
        let (r, m) = &self.cache[&(group, layer, mb)];
        (r, *m)
    }

    /// `rank`'s load ÷ balanced and its group's max.
    pub fn of_rank(&mut self, rank: u32, layer: u32, mb: u32) -> (f64, f64) {
        let (_, group) = self.grid.group_id(rank, GroupKind::Ep);
        let pos = self.grid.position(rank, GroupKind::Ep) as usize;
        let (r, max) = self.rank_loads(group, layer, mb);
        (r[pos], max)
    }

    /// The most loaded EP rank of pipeline stage `stage` (symmetric mode's actor).
    pub fn stage_max(&mut self, stage: u32, layer: u32, mb: u32) -> f64 {
        let per_stage = self.grid.stage_ranks() / self.ep;
        (per_stage * stage..per_stage * (stage + 1)).map(|g| self.rank_loads(g, layer, mb).1).fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests;
