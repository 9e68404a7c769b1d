//! Where the plan's ZeRO units and gradient buckets sit in a chunk's flat parameter
//! buffer, and which part of each bucket a data-parallel rank owns.
//!
//! A unit (a layer, the word or position table, the final norm) is one contiguous range
//! of `ParamLayout`'s flat buffer. The executor keeps parameters and gradients **per
//! unit** (one `Vec` each), so that ZeRO-2/3 can hold a bucket's units without the rest of
//! the chunk. A bucket is the concatenation of its units in the plan's order; with ZeRO ≥ 1
//! data-parallel rank d owns part d of it ([`crate::optim::ZeroShard::split`]), which may
//! cross unit boundaries (a MoE layer's routed experts, `Unit::Experts`, are buckets of
//! their own, owned by expert-data-parallel rank d): [`BucketInfo::pieces`] cuts an owned range back into
//! (unit, range inside the unit) pieces.

use std::collections::BTreeMap;
use std::ops::Range;

use strata_models::plan::{Bucket, GroupKind, Plan, Unit};

use crate::error::RuntimeError;
use crate::optim::ZeroShard;
use crate::params::{ChunkSpec, ParamKind, ParamLayout};
use crate::shard::TpRank;

/// A bucket of one chunk, as the executor uses it.
#[derive(Clone, Debug)]
pub struct BucketInfo {
    /// The bucket's index within its chunk (the plan's `bucket` in purposes and names).
    pub index: u32,
    /// (unit, its flat range in the chunk's buffer), in bucket order.
    pub units: Vec<(Unit, Range<usize>)>,
    /// Elements in the bucket.
    pub len: usize,
    /// The part this rank owns under ZeRO ≥ 1 (the whole bucket under ZeRO-0).
    pub owned: Range<usize>,
}

impl BucketInfo {
    /// Cuts a range of the bucket's concatenation into (unit, range inside that unit).
    pub fn pieces(&self, range: Range<usize>) -> Vec<(Unit, Range<usize>)> {
        let mut out = Vec::new();
        let mut at = 0;
        for (u, r) in &self.units {
            let (lo, hi) = (range.start.max(at), range.end.min(at + r.len()));
            if lo < hi {
                out.push((*u, lo - at..hi - at));
            }
            at += r.len();
        }
        out
    }

    /// Flat-buffer offset of the start of `unit`.
    pub fn unit_offset(&self, unit: Unit) -> usize {
        self.units.iter().find(|(u, _)| *u == unit).map(|(_, r)| r.start).expect("unit of this bucket")
    }
}

/// The flat range of `unit` in `layout`.
pub fn unit_range(layout: &ParamLayout, unit: Unit) -> Result<Range<usize>, RuntimeError> {
    let e = layout.entries();
    let span = |pick: &dyn Fn(&crate::params::ParamEntry) -> bool| {
        let hits: Vec<_> = e.iter().filter(|x| pick(x)).collect();
        hits.first().map(|f| f.offset..hits.last().map_or(f.offset, |l| l.offset + l.len()))
    };
    let r = match unit {
        Unit::WordEmbedding => span(&|x| x.kind == ParamKind::Wte),
        Unit::PosEmbedding => span(&|x| x.kind == ParamKind::Wpe),
        Unit::Layer(l) => span(&|x| x.layer == Some(l as usize) && x.expert.is_none()),
        Unit::Experts(l) => span(&|x| x.layer == Some(l as usize) && x.expert.is_some()),
        Unit::FinalNorm => span(&|x| matches!(x.kind, ParamKind::LnfW | ParamKind::LnfB)),
        Unit::OutputLayer => span(&|x| x.kind == ParamKind::OutW),
    };
    r.ok_or_else(|| {
        RuntimeError::BadSetting(format!("the plan names unit {unit:?}, which this chunk's parameters do not hold"))
    })
}

/// Buckets of one chunk: the plan's, checked against the runtime's layout. ZeRO shards a
/// dense bucket over `dp = (position, size)` and an expert bucket over `expert_dp`.
pub fn chunk_buckets(
    layout: &ParamLayout,
    plan_buckets: &[&Bucket],
    dp: (usize, usize),
    expert_dp: (usize, usize),
    zero: u8,
) -> Result<Vec<BucketInfo>, RuntimeError> {
    let mut out = Vec::new();
    let mut covered = 0;
    for b in plan_buckets {
        let units = b.units.iter().map(|u| unit_range(layout, *u).map(|r| (*u, r))).collect::<Result<Vec<_>, _>>()?;
        let len: usize = units.iter().map(|(_, r)| r.len()).sum();
        if len as u64 != b.params {
            return Err(RuntimeError::BadSetting(format!(
                "bucket {} of chunk {} holds {} parameters in the plan but {len} in the runtime's layout",
                b.index, b.chunk, b.params
            )));
        }
        covered += len;
        let (pos, size) = if b.is_expert() { expert_dp } else { dp };
        let owned = if zero >= 1 { ZeroShard::split(len, pos, size)?.range() } else { 0..len };
        out.push(BucketInfo { index: b.index, units, len, owned });
    }
    if covered != layout.len() {
        return Err(RuntimeError::BadSetting(format!(
            "the plan's buckets cover {covered} of the chunk's {} parameters",
            layout.len()
        )));
    }
    Ok(out)
}

/// Every model chunk of rank `rank` of `plan`: its parameter layout and its buckets (the
/// plan's, checked against the layout) — what every backend holds per chunk.
pub fn chunk_layouts(plan: &Plan, rank: u32) -> Result<Vec<(ParamLayout, Vec<BucketInfo>)>, RuntimeError> {
    let (s, coord) = (&plan.scenario, plan.grid.coord(rank));
    let p = &s.parallel;
    let tp = TpRank::new(coord.tp as usize, p.tp as usize)?;
    let pipe = plan.pipeline();
    (0..p.vpp)
        .map(|c| {
            let vs = pipe.vstage(c, coord.pp);
            let layers = p.chunk_layers(&s.model, vs);
            let spec = ChunkSpec {
                embedding: vs == 0,
                layers: layers.start as usize..layers.end as usize,
                head: vs == pipe.last_vstage(),
            };
            let ep = (plan.grid.position(rank, GroupKind::Ep) as usize, plan.grid.group_size(GroupKind::Ep) as usize);
            let layout = ParamLayout::with_ep(&s.model, tp, ep, spec)?;
            let plan_buckets: Vec<_> = plan.buckets[coord.pp as usize].iter().filter(|b| b.chunk == c).collect();
            // ZeRO shards over the data-parallel group (its cp · dp ranks), and a MoE layer's
            // experts over the expert-data-parallel group (the ranks holding the same experts).
            let group = |k| (plan.grid.position(rank, k) as usize, plan.grid.group_size(k) as usize);
            let (dp, edp) = (group(GroupKind::Dp), group(GroupKind::ExpertDp));
            let buckets = chunk_buckets(&layout, &plan_buckets, dp, edp, plan.scenario.zero_stage())?;
            Ok((layout, buckets))
        })
        .collect()
}

/// A chunk's tensors kept per unit.
pub type UnitVecs = BTreeMap<Unit, Vec<f32>>;

/// Splits a flat buffer into per-unit vectors.
pub fn split_units(buckets: &[BucketInfo], flat: &[f32]) -> UnitVecs {
    buckets.iter().flat_map(|b| b.units.iter()).map(|(u, r)| (*u, flat[r.clone()].to_vec())).collect()
}

/// Elements `range` of a bucket's concatenation, read from per-unit vectors.
pub fn read_segment(b: &BucketInfo, units: &UnitVecs, range: Range<usize>) -> Vec<f32> {
    let mut out = Vec::with_capacity(range.len());
    for (u, r) in b.pieces(range) {
        out.extend_from_slice(&units.get(&u).unwrap_or_else(|| panic!("unit {u:?} is not held"))[r]);
    }
    out
}

/// Writes `data` over elements `range` of a bucket's concatenation.
pub fn write_segment(b: &BucketInfo, units: &mut UnitVecs, range: Range<usize>, data: &[f32]) {
    assert_eq!(data.len(), range.len());
    let mut at = 0;
    for (u, r) in b.pieces(range) {
        let n = r.len();
        units.get_mut(&u).unwrap_or_else(|| panic!("unit {u:?} is not held"))[r].copy_from_slice(&data[at..at + n]);
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_ranges_cut_into_unit_pieces() {
        let b = BucketInfo {
            index: 0,
            units: vec![(Unit::Layer(3), 100..110), (Unit::Layer(2), 90..100), (Unit::FinalNorm, 110..114)],
            len: 24,
            owned: 8..16,
        };
        assert_eq!(b.pieces(8..16), vec![(Unit::Layer(3), 8..10), (Unit::Layer(2), 0..6)]);
        let mut units: UnitVecs = b.units.iter().map(|(u, r)| (*u, vec![0.0; r.len()])).collect();
        write_segment(&b, &mut units, 8..22, &[1.0; 14]);
        assert_eq!(read_segment(&b, &units, 0..24).iter().filter(|&&x| x == 1.0).count(), 14);
        assert_eq!(units[&Unit::FinalNorm], vec![1.0, 1.0, 0.0, 0.0]);
    }
}
