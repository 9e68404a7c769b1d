//! The simulated and the measured timeline of one step, one above the other on the same
//! time axis: a lane per (rank, stream), a bar per op coloured by what it does (forward,
//! backward-input, backward-weight, recompute, optimizer, tensor- / data-parallel
//! collective, pipeline message).
//!
//! Bars of one class that touch or nearly touch (a gap under half a pixel) are merged
//! before drawing, so a step with 10⁵ ops still makes an SVG of bounded size; alloc and
//! free take no time and are not drawn. At most [`MAX_RANKS`] ranks are shown: those both
//! traces cover, in rank order.

use std::collections::BTreeSet;

use plotters::coord::Shift;
use plotters::prelude::*;
use strata_models::plan::{CollKind, GroupKind, OpKind, Phase, Piece, Plan, Stream};
use strata_models::trace::Trace;

use super::{CategoryAxis, DrawResult, Figure, MUTED, PALETTE, font, swatch_legend, tick, time_unit};
use crate::op_kinds::op_name;
use crate::table::{Cell, Table};

pub const MAX_RANKS: usize = 8;
const LANE_PX: u32 = 18;
const PLOT_W: u32 = 1300;

/// What a bar shows, for its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Forward,
    BackwardInput,
    BackwardWeight,
    Recompute,
    Optimizer,
    TpCollective,
    DpCollective,
    OtherCollective,
    P2p,
}

impl Class {
    #[cfg(test)]
    const ALL: [Class; 9] = [
        Class::Forward,
        Class::BackwardInput,
        Class::BackwardWeight,
        Class::Recompute,
        Class::Optimizer,
        Class::TpCollective,
        Class::DpCollective,
        Class::OtherCollective,
        Class::P2p,
    ];

    fn of(kind: &OpKind) -> Option<Class> {
        Some(match kind {
            OpKind::Compute(c) if c.piece == Piece::Optimizer => Class::Optimizer,
            OpKind::Compute(c) => match c.phase {
                Phase::Forward => Class::Forward,
                Phase::BackwardInput => Class::BackwardInput,
                Phase::BackwardWeight => Class::BackwardWeight,
                Phase::Recompute => Class::Recompute,
                Phase::Step => Class::Optimizer,
            },
            OpKind::Collective(c) => match (c.group, c.kind) {
                (GroupKind::Tp, _) => Class::TpCollective,
                (GroupKind::Dp, CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather) => {
                    Class::DpCollective
                }
                _ => Class::OtherCollective,
            },
            OpKind::Send(_) | OpKind::Recv(_) => Class::P2p,
            OpKind::Alloc(_) | OpKind::Free { .. } => return None,
        })
    }

    fn color(self) -> RGBColor {
        match self {
            Class::Forward => PALETTE[0],
            Class::BackwardInput => PALETTE[1],
            Class::BackwardWeight => PALETTE[3],
            Class::Recompute => PALETTE[7],
            Class::Optimizer => PALETTE[6],
            Class::TpCollective => PALETTE[2],
            Class::DpCollective => PALETTE[5],
            Class::OtherCollective => PALETTE[8],
            Class::P2p => PALETTE[4],
        }
    }

    fn label(self) -> &'static str {
        match self {
            Class::Forward => "forward",
            Class::BackwardInput => "backward (input grad)",
            Class::BackwardWeight => "backward (weight grad)",
            Class::Recompute => "recompute",
            Class::Optimizer => "optimizer",
            Class::TpCollective => "TP collective",
            Class::DpCollective => "DP / ZeRO collective",
            Class::OtherCollective => "embedding / world collective",
            Class::P2p => "pipeline send / recv",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Bar {
    start_ns: u64,
    end_ns: u64,
    class: Class,
}

struct Panel {
    name: &'static str,
    makespan_ns: u64,
    /// Bars per lane, merged.
    lanes: Vec<Vec<Bar>>,
}

pub struct GanttPlot {
    title: String,
    lanes: Vec<(u32, Stream)>,
    panels: Vec<Panel>,
    classes: Vec<Class>,
    max_ns: u64,
}

/// Ranks shown: those of both traces (else of either), at most [`MAX_RANKS`].
pub fn shown_ranks(predicted: &Trace, measured: &Trace) -> Vec<u32> {
    let ranks =
        |t: &Trace| -> BTreeSet<u32> { t.ranks.iter().copied().chain(t.spans.iter().map(|s| s.rank)).collect() };
    let (p, m) = (ranks(predicted), ranks(measured));
    let both: Vec<u32> = p.intersection(&m).copied().collect();
    let pick = if both.is_empty() { p.union(&m).copied().collect() } else { both };
    pick.into_iter().take(MAX_RANKS).collect()
}

impl GanttPlot {
    pub fn new(title: &str, plan: &Plan, predicted: &Trace, measured: &Trace) -> GanttPlot {
        let ranks = shown_ranks(predicted, measured);
        let mut lanes = Vec::new();
        for &rank in &ranks {
            for stream in Stream::ALL {
                let busy =
                    |t: &Trace| t.spans.iter().any(|s| s.rank == rank && s.stream == stream && s.end_ns > s.start_ns);
                if busy(predicted) || busy(measured) {
                    lanes.push((rank, stream));
                }
            }
        }
        let max_ns = predicted.makespan_ns().max(measured.makespan_ns()).max(1);
        // Half a pixel of the plot width, in ns.
        let eps_ns = max_ns / (2 * PLOT_W as u64);
        let panel = |name, t: &Trace| Panel {
            name,
            makespan_ns: t.makespan_ns(),
            lanes: lanes.iter().map(|&(rank, stream)| lane_bars(plan, t, rank, stream, eps_ns)).collect(),
        };
        let panels = vec![panel("Simulated", predicted), panel("Measured", measured)];
        let used: BTreeSet<Class> = panels.iter().flat_map(|p| p.lanes.iter().flatten().map(|b| b.class)).collect();
        GanttPlot { title: title.to_string(), lanes, panels, classes: used.into_iter().collect(), max_ns }
    }

    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }
}

/// The lane's bars in time order, with near-adjacent bars of one class merged.
fn lane_bars(plan: &Plan, t: &Trace, rank: u32, stream: Stream, eps_ns: u64) -> Vec<Bar> {
    let mut bars: Vec<Bar> = t
        .spans
        .iter()
        .filter(|s| s.rank == rank && s.stream == stream && s.end_ns > s.start_ns)
        .filter_map(|s| {
            let class = Class::of(&plan.program(rank).ops[s.op as usize].kind)?;
            Some(Bar { start_ns: s.start_ns, end_ns: s.end_ns, class })
        })
        .collect();
    bars.sort_by_key(|b| (b.start_ns, b.end_ns, b.class));
    let mut merged: Vec<Bar> = Vec::with_capacity(bars.len());
    for b in bars {
        match merged.last_mut() {
            Some(last) if last.class == b.class && b.start_ns <= last.end_ns + eps_ns => {
                last.end_ns = last.end_ns.max(b.end_ns);
            }
            _ => merged.push(b),
        }
    }
    merged
}

/// Busy time per (source, rank, stream): the numbers behind the plot, in brief.
pub fn summary_table(id: &str, title: &str, plan: &Plan, predicted: &Trace, measured: &Trace) -> Table {
    let mut t = Table::new(id, title, &["source", "rank", "stream", "ops", "busy_s", "first_start_s", "last_end_s"]);
    for (source, trace) in [("simulated", predicted), ("measured", measured)] {
        for rank in shown_ranks(predicted, measured) {
            for stream in Stream::ALL {
                let spans: Vec<_> = trace
                    .spans
                    .iter()
                    .filter(|s| s.rank == rank && s.stream == stream)
                    .filter(|s| Class::of(&plan.program(rank).ops[s.op as usize].kind).is_some())
                    .collect();
                if spans.is_empty() {
                    continue;
                }
                let busy: u64 = spans.iter().map(|s| s.end_ns - s.start_ns).sum();
                let first = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
                let last = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
                t.push(vec![
                    source.into(),
                    rank.into(),
                    stream.key().into(),
                    (spans.len() as u64).into(),
                    (busy as f64 * 1e-9).into(),
                    (first as f64 * 1e-9).into(),
                    (last as f64 * 1e-9).into(),
                ]);
            }
        }
    }
    t
}

/// Every span of both traces (CSV only: it can have 10⁵ rows).
pub fn spans_table(id: &str, plan: &Plan, predicted: &Trace, measured: &Trace) -> Table {
    let mut t = Table::new(
        id,
        "Every span of both timelines",
        &["source", "rank", "stream", "op", "name", "start_ns", "end_ns"],
    );
    for (source, trace) in [("simulated", predicted), ("measured", measured)] {
        let mut spans: Vec<_> = trace.spans.iter().collect();
        spans.sort_by_key(|s| (s.rank, s.stream, s.start_ns, s.op, s.end_ns));
        for s in spans {
            let op = &plan.program(s.rank).ops[s.op as usize];
            t.push(vec![
                source.into(),
                s.rank.into(),
                s.stream.key().into(),
                s.op.into(),
                op_name(op).into(),
                Cell::Int(s.start_ns as i64),
                Cell::Int(s.end_ns as i64),
            ]);
        }
    }
    t
}

impl GanttPlot {
    fn panel_height(&self) -> u32 {
        90 + LANE_PX * self.lanes.len().max(1) as u32
    }
}

impl Figure for GanttPlot {
    fn size(&self) -> (u32, u32) {
        (PLOT_W, 60 + 2 * self.panel_height() + 60)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.draw(&Text::new(self.title.clone(), (16, 14), font(20.0)))?;
        let (_, body) = root.split_vertically(50);
        let (top, rest) = body.split_vertically(self.panel_height());
        let (bottom, legend) = rest.split_vertically(self.panel_height());
        let (mul, unit) = time_unit(self.max_ns as f64 * 1e-9);
        for (panel, area) in self.panels.iter().zip([&top, &bottom]) {
            self.draw_panel(area, panel, mul, unit)?;
        }
        let items: Vec<(RGBColor, String)> = self.classes.iter().map(|c| (c.color(), c.label().to_string())).collect();
        swatch_legend(&legend, &items, (150, 22), 14.0)
    }
}

impl GanttPlot {
    fn draw_panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        panel: &Panel,
        mul: f64,
        unit: &str,
    ) -> DrawResult<DB> {
        let n = self.lanes.len().max(1);
        let m = self.max_ns as f64 * 1e-9 * mul;
        let lane_label = |y: &f64| -> String {
            let i = n as i64 - 1 - y.floor() as i64;
            self.lanes.get(i.max(0) as usize).map(|(r, s)| format!("rank {r} · {}", s.key())).unwrap_or_default()
        };
        let caption = format!("{} — step {} {unit}", panel.name, tick(panel.makespan_ns as f64 * 1e-9 * mul));
        let mut chart = ChartBuilder::on(area)
            .caption(caption, font(17.0))
            .margin_left(10)
            .margin_right(24)
            .x_label_area_size(40)
            .y_label_area_size(130)
            .build_cartesian_2d(0.0..m, CategoryAxis::new(n))?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .disable_y_mesh()
            .light_line_style(RGBColor(0xF3, 0xF3, 0xF3))
            .bold_line_style(RGBColor(0xE0, 0xE0, 0xE0))
            .axis_style(MUTED)
            .label_style(font(13.0))
            .axis_desc_style(font(14.0))
            .x_desc(format!("time since step start ({unit})"))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&lane_label)
            .draw()?;
        // Shade every other rank's lanes so ranks read as groups.
        let mut shade = Vec::new();
        let mut i = 0;
        let mut k = 0;
        while i < self.lanes.len() {
            let rank = self.lanes[i].0;
            let j = self.lanes[i..].iter().position(|l| l.0 != rank).map_or(self.lanes.len(), |d| i + d);
            if k % 2 == 1 {
                shade.push(Rectangle::new(
                    [(0.0, (n - j) as f64), (m, (n - i) as f64)],
                    RGBColor(0xF4, 0xF6, 0xF9).filled(),
                ));
            }
            i = j;
            k += 1;
        }
        chart.draw_series(shade)?;
        let to = |ns: u64| ns as f64 * 1e-9 * mul;
        chart.draw_series(panel.lanes.iter().enumerate().flat_map(|(lane, bars)| {
            let y = (n - 1 - lane) as f64;
            bars.iter().map(move |b| {
                Rectangle::new([(to(b.start_ns), y + 0.15), (to(b.end_ns), y + 0.85)], b.class.color().filled())
            })
        }))?;
        Ok(())
    }
}

/// The lane labels, for tests.
pub fn lane_labels(plot: &GanttPlot) -> Vec<String> {
    plot.lanes.iter().map(|(r, s)| format!("rank {r} · {}", s.key())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_colours_are_distinct() {
        let colours: BTreeSet<(u8, u8, u8)> = Class::ALL.iter().map(|c| c.color().rgb()).collect();
        assert_eq!(colours.len(), Class::ALL.len());
    }
}
