//! Allocated bytes per rank over one step, predicted (solid) against measured (dashed),
//! one colour per rank, on one time axis. Samples are steps: a rank holds `bytes` from
//! `t_ns` until its next sample. Ranks shown: those both sides cover, at most
//! [`MAX_RANKS`].

use std::collections::BTreeSet;

use plotters::coord::Shift;
use plotters::prelude::*;
use strata_models::trace::MemSample;

use super::{DrawResult, Figure, INK, MUTED, PALETTE, bytes_unit, font, nice_max, tick, time_unit};
use crate::inputs::PlanComparison;
use crate::table::{Cell, Table};

pub const MAX_RANKS: usize = 8;
/// Above this many samples a rank's line keeps the maximum per time bucket.
const MAX_POINTS: usize = 4000;

/// Vertices (t_ns, bytes) of one step-function line.
type Line = Vec<(u64, u64)>;

pub struct MemoryPlot {
    title: String,
    ranks: Vec<u32>,
    /// Per shown rank: (predicted, measured) step points, (t_ns, bytes).
    lines: Vec<(Line, Line)>,
    end_ns: u64,
}

fn ranks_of(s: &[MemSample]) -> BTreeSet<u32> {
    s.iter().map(|m| m.rank).collect()
}

/// Ranks shown: those with samples on both sides (else either), at most [`MAX_RANKS`].
fn shown(predicted: &[MemSample], measured: &[MemSample]) -> Vec<u32> {
    let (p, m) = (ranks_of(predicted), ranks_of(measured));
    let both: Vec<u32> = p.intersection(&m).copied().collect();
    let pick = if both.is_empty() { p.union(&m).copied().collect() } else { both };
    pick.into_iter().take(MAX_RANKS).collect()
}

fn samples(s: &[MemSample], rank: u32) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = s.iter().filter(|m| m.rank == rank).map(|m| (m.t_ns, m.bytes)).collect();
    v.sort_unstable();
    v
}

/// Step-function vertices of the samples, held until `end_ns`; at most about
/// 2·[`MAX_POINTS`] vertices (bucket maxima beyond that).
fn steps(s: &[(u64, u64)], end_ns: u64) -> Vec<(u64, u64)> {
    let s: Vec<(u64, u64)> = if s.len() > MAX_POINTS {
        let width = end_ns.max(1).div_ceil(MAX_POINTS as u64);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(t, b) in s {
            let bucket_t = t / width * width;
            match out.last_mut() {
                Some(last) if last.0 == bucket_t => last.1 = last.1.max(b),
                _ => out.push((bucket_t, b)),
            }
        }
        out
    } else {
        s.to_vec()
    };
    let mut v = Vec::with_capacity(2 * s.len() + 1);
    for (i, &(t, b)) in s.iter().enumerate() {
        if i > 0 {
            v.push((t, s[i - 1].1));
        }
        v.push((t, b));
    }
    if let Some(&(t, b)) = s.last()
        && t < end_ns
    {
        v.push((end_ns, b));
    }
    v
}

impl MemoryPlot {
    pub fn new(p: &PlanComparison) -> MemoryPlot {
        let (pred, meas) = (p.timelines.predicted_memory(), p.timelines.measured_memory());
        let ranks = shown(pred, meas);
        let end_ns = pred.iter().chain(meas).map(|m| m.t_ns).max().unwrap_or(0).max(
            [&p.timelines.predicted_trace, &p.timelines.measured_trace]
                .into_iter()
                .flatten()
                .map(|t| t.makespan_ns())
                .max()
                .unwrap_or(0),
        );
        let lines =
            ranks.iter().map(|&r| (steps(&samples(pred, r), end_ns), steps(&samples(meas, r), end_ns))).collect();
        MemoryPlot {
            title: format!("Memory per rank over the step: {} ({})", p.name, p.scenario.short()),
            ranks,
            lines,
            end_ns,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }
}

/// Peak allocated bytes per rank, predicted vs measured.
pub fn peak_table(p: &PlanComparison) -> Table {
    let mut t = Table::new(
        format!("peak-memory-{}", p.slug()),
        format!("Peak memory per rank, {}", p.name),
        &["rank", "predicted_bytes", "measured_bytes", "error_pct"],
    );
    let ranks: BTreeSet<u32> = p.predicted_peak_bytes.iter().chain(&p.measured_peak_bytes).map(|r| r.rank).collect();
    let find = |v: &[crate::inputs::RankBytes], r: u32| v.iter().find(|x| x.rank == r).map(|x| x.bytes);
    for r in ranks {
        let (pr, me) = (find(&p.predicted_peak_bytes, r), find(&p.measured_peak_bytes, r));
        let err = match (pr, me) {
            (Some(a), Some(b)) if b > 0 => Cell::Float(100.0 * (a as f64 / b as f64 - 1.0)),
            _ => Cell::Empty,
        };
        let cell = |v: Option<u64>| v.map_or(Cell::Empty, Cell::from);
        t.push(vec![r.into(), cell(pr), cell(me), err]);
    }
    t
}

/// The samples behind the plot.
pub fn samples_table(p: &PlanComparison) -> Table {
    let mut t = Table::new(
        format!("memory-{}", p.slug()),
        format!("Allocated bytes over time, {}", p.name),
        &["source", "rank", "t_ns", "bytes"],
    );
    for (source, s) in [("predicted", p.timelines.predicted_memory()), ("measured", p.timelines.measured_memory())] {
        let mut s = s.to_vec();
        s.sort_by_key(|m| (m.rank, m.t_ns, m.bytes));
        for m in s {
            t.push(vec![source.into(), m.rank.into(), Cell::Int(m.t_ns as i64), m.bytes.into()]);
        }
    }
    t
}

impl Figure for MemoryPlot {
    fn size(&self) -> (u32, u32) {
        (1100, 560)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let top = self.lines.iter().flat_map(|(p, m)| p.iter().chain(m)).map(|x| x.1).max().unwrap_or(1) as f64;
        let (div, bunit) = bytes_unit(top);
        let (mul, tunit) = time_unit(self.end_ns as f64 * 1e-9);
        let x_max = (self.end_ns.max(1) as f64 * 1e-9 * mul).max(f64::MIN_POSITIVE);
        let y_max = nice_max(top / div * 1.08);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, font(20.0))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .light_line_style(RGBColor(0xF3, 0xF3, 0xF3))
            .bold_line_style(RGBColor(0xE0, 0xE0, 0xE0))
            .axis_style(MUTED)
            .label_style(font(14.0))
            .axis_desc_style(font(16.0))
            .x_desc(format!("time since step start ({tunit})"))
            .y_desc(format!("allocated ({bunit})"))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        let pt = |&(t, b): &(u64, u64)| (t as f64 * 1e-9 * mul, b as f64 / div);
        for (i, (rank, (pred, meas))) in self.ranks.iter().zip(&self.lines).enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(pred.iter().map(pt), color.stroke_width(2)))?
                .label(format!("rank {rank}"))
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.filled()));
            chart.draw_series(DashedLineSeries::new(meas.iter().map(pt), 7, 5, color.stroke_width(2)))?;
        }
        // Line-style key, drawn as legend entries without data.
        chart
            .draw_series(LineSeries::new(std::iter::empty::<(f64, f64)>(), INK.stroke_width(2)))?
            .label("predicted (solid)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], INK.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(std::iter::empty::<(f64, f64)>(), INK.stroke_width(2)))?
            .label("measured (dashed)")
            .legend(|(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new([(0, 0), (6, 0)], INK.stroke_width(2))
                    + PathElement::new([(10, 0), (16, 0)], INK.stroke_width(2))
            });
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(font(14.0))
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(0xCC, 0xCC, 0xCC))
            .draw()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_hold_each_value_until_the_next_sample() {
        assert_eq!(steps(&[(0, 5), (10, 7)], 20), vec![(0, 5), (10, 5), (10, 7), (20, 7)]);
        let many: Vec<(u64, u64)> = (0..10_000).map(|i| (i, i % 97)).collect();
        let s = steps(&many, 10_000);
        assert!(s.len() <= 2 * MAX_POINTS + 1, "{}", s.len());
        assert_eq!(s.iter().map(|x| x.1).max(), Some(96));
    }
}
