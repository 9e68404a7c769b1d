//! The search landscape: best throughput found at each (tp, pp), as a heat map. Colour is
//! tokens/s on the viridis scale (dark = slow, yellow = fast); cells where every
//! configuration ran out of memory or was invalid are hatched grey with an ×, and the best
//! cell is outlined.

use std::collections::BTreeSet;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{CategoryAxis, DrawResult, Figure, INK, MUTED, font};
use crate::inputs::SearchLandscape;
use crate::table::{Table, sig};

/// Viridis, sampled at 8 stops (matplotlib's, public domain).
const VIRIDIS: [(u8, u8, u8); 8] = [
    (68, 1, 84),
    (70, 50, 126),
    (54, 92, 141),
    (39, 127, 142),
    (31, 161, 135),
    (74, 193, 109),
    (160, 218, 57),
    (253, 231, 37),
];

/// Colour of `x` in [0, 1].
pub fn viridis(x: f64) -> RGBColor {
    let x = if x.is_finite() { x.clamp(0.0, 1.0) } else { 0.0 };
    let f = x * (VIRIDIS.len() - 1) as f64;
    let i = (f.floor() as usize).min(VIRIDIS.len() - 2);
    let t = f - i as f64;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |p: u8, q: u8| (p as f64 + (q as f64 - p as f64) * t).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Throughput with a k / M suffix: `12.3k`, `1.25M`, `950`.
fn tokens(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", sig(v / 1e6, 3))
    } else if v >= 1e3 {
        format!("{}k", sig(v / 1e3, 3))
    } else {
        sig(v, 3)
    }
}

pub struct LandscapePlot<'a> {
    l: &'a SearchLandscape,
    tps: Vec<u32>,
    pps: Vec<u32>,
}

impl<'a> LandscapePlot<'a> {
    pub fn new(l: &'a SearchLandscape) -> LandscapePlot<'a> {
        let tps: BTreeSet<u32> = l.cells.iter().map(|c| c.tp).collect();
        let pps: BTreeSet<u32> = l.cells.iter().map(|c| c.pp).collect();
        LandscapePlot { l, tps: tps.into_iter().collect(), pps: pps.into_iter().collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.l.cells.is_empty()
    }
}

/// The numbers behind the plot, sorted by (tp, pp).
pub fn table(l: &SearchLandscape) -> Table {
    let mut t = Table::new(
        "landscape",
        "Search landscape: best throughput per (tp, pp)",
        &["tp", "pp", "tokens_per_s", "label"],
    );
    let mut cells: Vec<_> = l.cells.iter().collect();
    cells.sort_by_key(|c| (c.tp, c.pp));
    for c in cells {
        t.push(vec![c.tp.into(), c.pp.into(), c.tokens_per_s.into(), c.label.clone().into()]);
    }
    t
}

impl Figure for LandscapePlot<'_> {
    fn size(&self) -> (u32, u32) {
        let w = (260 + 150 * self.tps.len().max(1) as u32).clamp(700, 1400);
        let h = (200 + 90 * self.pps.len().max(1) as u32).clamp(420, 1100);
        (w, h)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (w, _) = root.dim_in_pixel();
        let (main, bar) = root.split_horizontally(w - 130);
        let (nx, ny) = (self.tps.len().max(1), self.pps.len().max(1));
        let values: Vec<f64> = self.l.cells.iter().filter_map(|c| c.tokens_per_s).collect();
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(0.0, f64::max);
        let norm = |v: f64| if hi > lo { (v - lo) / (hi - lo) } else { 1.0 };
        let tps = self.tps.clone();
        let pps = self.pps.clone();
        let xl = move |v: &f64| tps.get(v.floor().max(0.0) as usize).map(|t| t.to_string()).unwrap_or_default();
        let yl = move |v: &f64| pps.get(v.floor().max(0.0) as usize).map(|p| p.to_string()).unwrap_or_default();
        let mut chart = ChartBuilder::on(&main)
            .caption("Search landscape: throughput over tp × pp", font(20.0))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(60)
            .build_cartesian_2d(CategoryAxis::new(nx), CategoryAxis::new(ny))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .axis_style(MUTED)
            .label_style(font(15.0))
            .axis_desc_style(font(16.0))
            .x_desc("tensor-parallel size (tp)")
            .y_desc("pipeline-parallel size (pp)")
            .x_label_formatter(&xl)
            .y_label_formatter(&yl)
            .draw()?;
        let best = self
            .l
            .cells
            .iter()
            .filter(|c| c.tokens_per_s.is_some())
            .max_by(|a, b| a.tokens_per_s.unwrap_or(0.0).total_cmp(&b.tokens_per_s.unwrap_or(0.0)));
        for c in &self.l.cells {
            let x = self.tps.iter().position(|&t| t == c.tp).unwrap_or(0) as f64;
            let y = self.pps.iter().position(|&p| p == c.pp).unwrap_or(0) as f64;
            let (x0, y0, x1, y1) = (x + 0.02, y + 0.025, x + 0.98, y + 0.975);
            match c.tokens_per_s {
                Some(v) => {
                    let fill = viridis(norm(v));
                    chart.draw_series([Rectangle::new([(x0, y0), (x1, y1)], fill.filled())])?;
                    let ink = if norm(v) > 0.55 { INK } else { WHITE };
                    chart.draw_series([EmptyElement::at((x + 0.5, y + 0.5))
                        + Text::new(
                            format!("{} tok/s", tokens(v)),
                            (0, -10),
                            font(16.0).color(&ink).pos(Pos::new(HPos::Center, VPos::Center)),
                        )
                        + Text::new(
                            c.label.clone(),
                            (0, 12),
                            font(12.0).color(&ink).pos(Pos::new(HPos::Center, VPos::Center)),
                        )])?;
                }
                None => {
                    let grey = RGBColor(0xE6, 0xE6, 0xE6);
                    chart.draw_series([Rectangle::new([(x0, y0), (x1, y1)], grey.filled())])?;
                    // Hatch: diagonal lines at a fixed step in cell units.
                    let hatch = RGBColor(0xC4, 0xC4, 0xC4).stroke_width(1);
                    let k = 8;
                    chart.draw_series((1..2 * k).map(|i| {
                        let s = i as f64 / k as f64;
                        let (a, b) = if s <= 1.0 { ((0.0, s), (s, 0.0)) } else { ((s - 1.0, 1.0), (1.0, s - 1.0)) };
                        let p = |(u, v): (f64, f64)| (x0 + u * (x1 - x0), y0 + v * (y1 - y0));
                        PathElement::new([p(a), p(b)], hatch)
                    }))?;
                    let cross = RGBColor(0xB0, 0x3A, 0x2E).stroke_width(3);
                    let (cx, cy, r) = (x + 0.5, y + 0.5, 0.12);
                    chart.draw_series([
                        PathElement::new([(cx - r, cy - r), (cx + r, cy + r)], cross),
                        PathElement::new([(cx - r, cy + r), (cx + r, cy - r)], cross),
                    ])?;
                    chart.draw_series([EmptyElement::at((x + 0.5, y + 0.2))
                        + Text::new(
                            c.label.clone(),
                            (0, 0),
                            font(13.0).color(&INK).pos(Pos::new(HPos::Center, VPos::Center)),
                        )])?;
                }
            }
        }
        if let Some(c) = best {
            let x = self.tps.iter().position(|&t| t == c.tp).unwrap_or(0) as f64;
            let y = self.pps.iter().position(|&p| p == c.pp).unwrap_or(0) as f64;
            chart.draw_series([Rectangle::new([(x + 0.02, y + 0.025), (x + 0.98, y + 0.975)], INK.stroke_width(3))])?;
            chart.draw_series([EmptyElement::at((x + 0.5, y + 0.93))
                + Text::new("best", (0, 0), font(13.0).color(&INK).pos(Pos::new(HPos::Center, VPos::Top)))])?;
        }
        draw_colorbar(&bar, lo, hi)
    }
}

fn draw_colorbar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, lo: f64, hi: f64) -> DrawResult<DB> {
    if !(lo.is_finite() && hi > 0.0) {
        return Ok(());
    }
    let (_, h) = area.dim_in_pixel();
    let (top, bottom) = (70, h as i32 - 90);
    let steps = 64;
    for i in 0..steps {
        let y0 = bottom - (bottom - top) * (i + 1) / steps;
        let y1 = bottom - (bottom - top) * i / steps;
        area.draw(&Rectangle::new([(10, y0), (34, y1)], viridis(i as f64 / (steps - 1) as f64).filled()))?;
    }
    area.draw(&Rectangle::new([(10, top), (34, bottom)], MUTED.stroke_width(1)))?;
    area.draw(&Text::new("tokens/s", (6, top - 30), font(14.0)))?;
    area.draw(&Text::new(tokens(hi), (40, top - 6), font(13.0)))?;
    area.draw(&Text::new(tokens(lo), (40, bottom - 8), font(13.0)))?;
    area.draw(&Text::new("× = out of", (6, bottom + 16), font(12.0).color(&MUTED)))?;
    area.draw(&Text::new("memory or", (6, bottom + 31), font(12.0).color(&MUTED)))?;
    area.draw(&Text::new("invalid", (6, bottom + 46), font(12.0).color(&MUTED)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viridis_ends_and_suffixes() {
        assert_eq!(viridis(0.0).rgb(), (68, 1, 84));
        assert_eq!(viridis(1.0).rgb(), (253, 231, 37));
        assert_eq!(tokens(12_345.0), "12.3k");
        assert_eq!(tokens(950.0), "950");
    }
}
