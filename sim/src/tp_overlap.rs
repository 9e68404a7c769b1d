//! Megatron-LM's `--tp-comm-overlap` (`parallel.tp_comm_overlap`, resolved by
//! `Scenario::tp_comm_overlap`) as the simulator times it.
//!
//! Transformer Engine's userbuffers cut a sequence-parallel GEMM into tp chunks and move
//! one chunk while the GEMM works on another: the forward all-gather before the QKV and
//! FC1 GEMMs (ring exchange), the forward reduce-scatter after the output projection and
//! FC2 (pipelined), and in backward the all-gather of the output gradient before the
//! projection's and FC2's data-gradient GEMMs. (The backward's other two collectives — the
//! re-gather of the saved input and the reduce-scatter of the input gradient — already run
//! beside the data- and weight-gradient GEMMs in the plan, as Megatron-LM issues them
//! asynchronously without the flag.)
//!
//! With a collective of `c` seconds alone beside a GEMM of `g` seconds, cut in n = tp
//! chunks, the pair takes max(g·σ, c) + min(g, c)/n: the longer of the two, the GEMM slowed
//! by the profile's `overlap.tp_slowdown` σ (the communication shares the SMs and memory),
//! plus the one chunk that cannot overlap (the first GEMM chunk waits for nothing but the
//! last transfer waits for the last GEMM chunk, or the other way round). The plan keeps its
//! data dependencies (the GEMM's piece still follows its all-gather, the reduce-scatter
//! its piece — the executors run them so), so the simulator charges the collective with
//! what the overlap leaves exposed, [`exposed_s`]: its bytes are scaled so that the
//! network's time for it, alone, is that exposed time. The collective still crosses the
//! network model, so the breakdown's exposed tensor-parallel time is what the overlap
//! leaves. Applied to the dense layers' `Attn` and `Mlp` pieces; context-parallel attention
//! pieces and MoE layers keep their collectives whole.

use std::collections::BTreeMap;

use strata_models::plan::{CollKind, CollPurpose, Coord, OpKind, Phase, Piece, Plan, TpSite};

use crate::compute::ComputeModel;
use crate::net::closed_form::ClosedFormNetwork;
use crate::net::nccl::NcclEnv;
use crate::net::{CommKind, CommRequest};
use crate::program::{OpInfo, ProgramTable};

/// Seconds of a tensor-parallel collective of `comm_s` alone that stay exposed when it
/// overlaps a GEMM of `gemm_s` cut into `tp` chunks, the GEMM slowed by `slowdown` while
/// they share the GPU. May exceed `comm_s` where the slowdown costs more than the overlap
/// hides (a short collective beside a long GEMM).
pub fn exposed_s(comm_s: f64, gemm_s: f64, tp: u32, slowdown: f64) -> f64 {
    let n = tp.max(1) as f64;
    ((gemm_s * slowdown).max(comm_s) + comm_s.min(gemm_s) / n - gemm_s).max(0.0)
}

/// The GEMM a tensor-parallel collective overlaps under `--tp-comm-overlap`, if it is one
/// Transformer Engine overlaps: `true` for the piece's first GEMM (the all-gathers feed
/// it), `false` for its last (the forward reduce-scatter follows it).
pub fn overlapped_gemm(site: TpSite, piece: Piece, phase: Phase) -> Option<bool> {
    if !matches!(piece, Piece::Attn | Piece::Mlp) {
        return None;
    }
    match (site, phase) {
        (TpSite::Gather, Phase::Forward | Phase::Recompute | Phase::BackwardInput) => Some(true),
        (TpSite::Reduce, Phase::Forward | Phase::Recompute) => Some(false),
        _ => None,
    }
}

/// Scales the bytes of every overlapped tensor-parallel collective of `tables` (programs
/// `used`) to what [`exposed_s`] leaves, when the scenario runs `--tp-comm-overlap`.
pub fn apply(plan: &Plan, used: &[usize], tables: &mut [ProgramTable], model: &ComputeModel, slowdown: f64) {
    let s = &plan.scenario;
    let tp = s.parallel.tp;
    if !s.tp_comm_overlap() || tp < 2 {
        return;
    }
    let Ok(net) = ClosedFormNetwork::new(&s.cluster, NcclEnv::default()) else { return };
    let g = plan.grid;
    let ranks: Vec<u32> = (0..tp).map(|t| g.rank(Coord { tp: t, cp: 0, dp: 0, pp: 0 })).collect();
    let time_s = |kind: CollKind, bytes: u64| {
        let req = CommRequest { kind: CommKind::Collective(kind), ranks: ranks.clone(), bytes, multiplicity: 1 };
        net.cost(&req).time_ns as f64 * 1e-9
    };
    // (kind, bytes, gemm ns) → scaled bytes: every layer's collectives are alike.
    let mut memo: BTreeMap<(u8, u64, u64), u64> = BTreeMap::new();
    for (table, &p) in tables.iter_mut().zip(used) {
        let program = &plan.programs[p];
        let mut costs: BTreeMap<(Piece, Phase, u32, u32, u32), u32> = BTreeMap::new();
        for op in &program.ops {
            if let OpKind::Compute(c) = &op.kind {
                costs.insert((c.piece, c.phase, c.mb, c.chunk, c.layer), c.cost);
            }
        }
        for (i, op) in program.ops.iter().enumerate() {
            let OpKind::Collective(c) = &op.kind else { continue };
            let CollPurpose::Tp { site, piece, phase, mb, chunk, layer } = c.purpose else { continue };
            let Some(first) = overlapped_gemm(site, piece, phase) else { continue };
            let Some(cost) = costs.get(&(piece, phase, mb, chunk, layer)).and_then(|&id| plan.costs.get(id as usize))
            else {
                continue;
            };
            let gemm = if first { cost.gemms.first() } else { cost.gemms.last() };
            let gemm_s = gemm.map_or(0.0, |g| model.gemm_s(g));
            let key = (c.kind as u8, c.bytes, (gemm_s * 1e9).round() as u64);
            let bytes = *memo.entry(key).or_insert_with(|| {
                let (whole, latency) = (time_s(c.kind, c.bytes), time_s(c.kind, 0));
                if whole <= latency {
                    return c.bytes;
                }
                let exposed = exposed_s(whole, gemm_s, tp, slowdown);
                let scale = ((exposed - latency) / (whole - latency)).max(0.0);
                (c.bytes as f64 * scale).round() as u64
            });
            if let Some(OpInfo::Collective { bytes: b, .. }) = table.info.get_mut(i) {
                *b = bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longer_of_the_two_plus_one_chunk_stays() {
        // A collective shorter than its GEMM: only the slowdown and one chunk stay.
        let e = exposed_s(0.6, 1.0, 8, 1.0);
        assert!((e - 0.6 / 8.0).abs() < 1e-12, "{e}");
        // Longer: what the GEMM does not cover, plus one GEMM-sized chunk.
        let e = exposed_s(2.0, 1.0, 4, 1.0);
        assert!((e - (1.0 + 0.25)).abs() < 1e-12, "{e}");
        // A slowdown can make the overlap cost more than the collective alone.
        assert!(exposed_s(0.05, 1.0, 2, 1.15) > 0.05);
        // Nothing to overlap with: the collective stays whole.
        assert!((exposed_s(0.3, 0.0, 8, 1.15) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn only_the_sites_transformer_engine_overlaps() {
        assert_eq!(overlapped_gemm(TpSite::Gather, Piece::Attn, Phase::Forward), Some(true));
        assert_eq!(overlapped_gemm(TpSite::Reduce, Piece::Mlp, Phase::Forward), Some(false));
        assert_eq!(overlapped_gemm(TpSite::Gather, Piece::Mlp, Phase::BackwardInput), Some(true));
        assert_eq!(overlapped_gemm(TpSite::Reduce, Piece::Attn, Phase::BackwardInput), None);
        assert_eq!(overlapped_gemm(TpSite::GatherSaved, Piece::Attn, Phase::BackwardWeight), None);
        assert_eq!(overlapped_gemm(TpSite::Gather, Piece::Logits, Phase::Forward), None);
    }
}
