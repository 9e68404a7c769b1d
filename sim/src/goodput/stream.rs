//! The failures of one trial, in wall-clock order: a seeded superposition of every unit's
//! renewal process, drawn lazily and kept, so every checkpoint interval a trial tries meets
//! the same failures (common random numbers: the intervals differ by their policy, not by
//! their luck).
//!
//! Failures are a property of the hardware, not of the job: they strike during compute,
//! checkpoints and restarts alike (Daly's assumption). An exponential cause is one Poisson
//! stream of rate units/MTBF (memoryless, so pooling its units is exact); a Weibull cause
//! is one renewal process per unit, scale MTBF/Γ(1 + 1/k), every unit new at t = 0 and
//! replaced by a new one when it fails. Times are integer nanoseconds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_models::faults::failures::{Cause, Distribution, Process};

use super::closed::gamma;

/// One failure: when (ns since the start) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub t_ns: u64,
    pub cause: Cause,
}

/// A source of failures: a pooled exponential cause, or one unit of a Weibull cause.
#[derive(Clone, Copy, Debug)]
struct Source {
    cause: Cause,
    /// Exponential: mean time to the next failure; Weibull: the scale. Seconds.
    scale_s: f64,
    /// 1 for exponential.
    shape: f64,
}

/// The lazily drawn failures of one trial.
pub struct FailureStream {
    rng: ChaCha8Rng,
    sources: Vec<Source>,
    /// Next failure of each source: (time, source index).
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    drawn: Vec<Failure>,
}

/// The seed of trial `trial` of a run seeded `seed` (SplitMix64 of both): independent
/// streams per trial whatever thread runs it.
pub fn trial_seed(seed: u64, trial: u64) -> u64 {
    let mut z = seed ^ trial.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FailureStream {
    pub fn new(processes: &[Process], seed: u64) -> FailureStream {
        let mut sources = Vec::new();
        for p in processes {
            let mtbf_s = p.mtbf_hours * 3600.0;
            match p.distribution {
                Distribution::Exponential => {
                    sources.push(Source { cause: p.cause, scale_s: mtbf_s / p.units.max(1) as f64, shape: 1.0 })
                }
                Distribution::Weibull => {
                    let scale_s = mtbf_s / gamma(1.0 + 1.0 / p.shape);
                    sources.extend((0..p.units).map(|_| Source { cause: p.cause, scale_s, shape: p.shape }));
                }
            }
        }
        let mut s =
            FailureStream { rng: ChaCha8Rng::seed_from_u64(seed), sources, heap: BinaryHeap::new(), drawn: Vec::new() };
        for i in 0..s.sources.len() {
            let t = s.draw_after(0, i);
            s.heap.push(Reverse((t, i as u32)));
        }
        s
    }

    /// The time of source `i`'s next failure after `t_ns`.
    fn draw_after(&mut self, t_ns: u64, i: usize) -> u64 {
        let src = self.sources[i];
        // 1 − U is in (0, 1]: −ln of it is finite.
        let e = -(1.0 - self.rng.random::<f64>()).ln();
        let gap_s = if src.shape == 1.0 { src.scale_s * e } else { src.scale_s * e.powf(1.0 / src.shape) };
        // At least 1 ns apart, and saturating: a gap past 2^64 ns (585 years) is never.
        t_ns.saturating_add(((gap_s * 1e9) as u64).max(1))
    }

    /// The `k`-th failure (0-based), drawing as needed. `None` when nothing can fail.
    pub fn get(&mut self, k: usize) -> Option<Failure> {
        while self.drawn.len() <= k {
            let Reverse((t, i)) = self.heap.pop()?;
            self.drawn.push(Failure { t_ns: t, cause: self.sources[i as usize].cause });
            let next = self.draw_after(t, i as usize);
            self.heap.push(Reverse((next, i)));
        }
        Some(self.drawn[k])
    }

    /// Failures drawn so far.
    pub fn drawn(&self) -> usize {
        self.drawn.len()
    }
}
