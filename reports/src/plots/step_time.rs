//! Predicted against measured step time across plans: one point per plan at
//! (predicted, median measured), whiskers from the fastest to the slowest measured step,
//! the line y = x (a perfect prediction) and the band where the relative error
//! |predicted − measured| / measured is at most 10 %, i.e. x/1.1 ≤ y ≤ x/0.9.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{DrawResult, Figure, INK, MEASURED, MUTED, PREDICTED, font, nice_max, pct, tick, time_unit};
use crate::inputs::ComparisonSet;
use crate::table::{Cell, Table};

/// Relative error inside the band.
pub const BAND: f64 = 0.10;

struct Point {
    label: String,
    predicted_s: f64,
    measured_s: f64,
    min_s: f64,
    max_s: f64,
    error: f64,
}

pub struct StepTimePlot {
    points: Vec<Point>,
}

impl StepTimePlot {
    pub fn new(set: &ComparisonSet) -> StepTimePlot {
        let points = set
            .plans
            .iter()
            .map(|p| Point {
                label: format!("{}  ({})", p.name, p.scenario.short()),
                predicted_s: p.predicted_step_s,
                measured_s: p.measured_step_s(),
                min_s: p.measured_steps_s.iter().copied().fold(f64::INFINITY, f64::min),
                max_s: p.measured_steps_s.iter().copied().fold(0.0, f64::max),
                error: p.step_error(),
            })
            .collect();
        StepTimePlot { points }
    }
}

/// The numbers behind the plot.
pub fn table(set: &ComparisonSet) -> Table {
    let mut t = Table::new(
        "step-time",
        "Step time, predicted vs measured",
        &[
            "#",
            "plan",
            "configuration",
            "predicted_s",
            "measured_median_s",
            "measured_min_s",
            "measured_max_s",
            "measured_steps",
            "error_pct",
        ],
    );
    for (i, p) in set.plans.iter().enumerate() {
        let steps = &p.measured_steps_s;
        t.push(vec![
            Cell::Int(i as i64 + 1),
            p.name.clone().into(),
            p.scenario.short().into(),
            p.predicted_step_s.into(),
            p.measured_step_s().into(),
            steps.iter().copied().fold(f64::INFINITY, f64::min).into(),
            steps.iter().copied().fold(0.0, f64::max).into(),
            (steps.len() as u64).into(),
            (100.0 * p.step_error()).into(),
        ]);
    }
    t
}

impl Figure for StepTimePlot {
    fn size(&self) -> (u32, u32) {
        (1100, 640)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (left, right) = root.split_horizontally(660);
        let top = self.points.iter().map(|p| p.predicted_s.max(p.max_s)).fold(0.0, f64::max);
        let (mul, unit) = time_unit(top);
        let m = nice_max(top * mul * 1.05);
        let mut chart = ChartBuilder::on(&left)
            .caption("Step time: predicted vs measured", font(22.0))
            .margin(16)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..m, 0.0..m)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
            .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
            .axis_style(MUTED)
            .label_style(font(14.0))
            .axis_desc_style(font(16.0))
            .x_desc(format!("predicted step time ({unit})"))
            .y_desc(format!("measured step time, median ({unit})"))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        let band = vec![(0.0, 0.0), (m * (1.0 - BAND), m), (m, m), (m, m / (1.0 + BAND))];
        chart
            .draw_series(std::iter::once(Polygon::new(band, PREDICTED.mix(0.13).filled())))?
            .label(format!("±{:.0}% error band", BAND * 100.0))
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], PREDICTED.mix(0.25).filled()));
        chart
            .draw_series(LineSeries::new([(0.0, 0.0), (m, m)], INK.stroke_width(1)))?
            .label("y = x (perfect prediction)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], INK.stroke_width(1)));
        let whisker = MEASURED.stroke_width(2);
        for p in &self.points {
            let x = p.predicted_s * mul;
            chart.draw_series([PathElement::new([(x, p.min_s * mul), (x, p.max_s * mul)], whisker)])?;
        }
        chart
            .draw_series(
                self.points
                    .iter()
                    .map(|p| Circle::new((p.predicted_s * mul, p.measured_s * mul), 6, MEASURED.filled())),
            )?
            .label("plan (median step; whisker: min–max)")
            .legend(|(x, y)| Circle::new((x + 8, y), 5, MEASURED.filled()));
        let centres: Vec<(i32, i32)> =
            self.points.iter().map(|p| chart.backend_coord(&(p.predicted_s * mul, p.measured_s * mul))).collect();
        let offsets = place_labels(&centres);
        chart.draw_series(self.points.iter().zip(offsets).enumerate().map(|(i, (p, off))| {
            let at = (p.predicted_s * mul, p.measured_s * mul);
            EmptyElement::at(at)
                + Circle::new((0, 0), 6, INK.stroke_width(1))
                + Text::new(format!("{}", i + 1), off, font(15.0))
        }))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(font(14.0))
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(0xCC, 0xCC, 0xCC))
            .draw()?;
        draw_key(&right, &self.points)
    }
}

/// Offsets (from each point) for the number labels, chosen greedily so that a label
/// covers neither a point nor an earlier label when one of eight places allows it.
fn place_labels(centres: &[(i32, i32)]) -> Vec<(i32, i32)> {
    type Box4 = (i32, i32, i32, i32);
    let overlaps = |a: Box4, b: Box4| a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3;
    let mut taken: Vec<Box4> = centres.iter().map(|&(x, y)| (x - 7, y - 7, x + 7, y + 7)).collect();
    let mut out = Vec::with_capacity(centres.len());
    for (i, &(x, y)) in centres.iter().enumerate() {
        let w = 9 * format!("{}", i + 1).len() as i32;
        let h = 16;
        let candidates =
            [(8, -20), (8, 4), (-8 - w, -20), (-8 - w, 4), (11, -8), (-11 - w, -8), (-w / 2, -26), (-w / 2, 10)];
        let pick = candidates
            .iter()
            .copied()
            .find(|&(dx, dy)| {
                let b = (x + dx, y + dy, x + dx + w, y + dy + h);
                !taken.iter().any(|&t| overlaps(b, t))
            })
            .unwrap_or(candidates[0]);
        taken.push((x + pick.0, y + pick.1, x + pick.0 + w, y + pick.1 + h));
        out.push(pick);
    }
    out
}

/// The list that maps point numbers to plans, with each plan's error.
fn draw_key<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, points: &[Point]) -> DrawResult<DB> {
    let (_, h) = area.dim_in_pixel();
    area.draw(&Text::new("Plans (error = predicted / measured − 1)", (10, 52), font(16.0)))?;
    let line_h = 22;
    let fits = ((h as i32 - 110) / line_h).max(1) as usize;
    for (i, p) in points.iter().enumerate().take(fits) {
        let y = 84 + i as i32 * line_h;
        let inside = p.error.abs() <= BAND;
        let err_style = font(14.0).color(if inside { &INK } else { &RGBColor(0xC0, 0x39, 0x2B) });
        area.draw(&Text::new(format!("{:>2}", i + 1), (10, y), font(14.0)))?;
        area.draw(&Text::new(pct(p.error), (36, y), err_style))?;
        area.draw(&Text::new(p.label.clone(), (96, y), font(14.0)))?;
    }
    if points.len() > fits {
        let y = 84 + fits as i32 * line_h;
        area.draw(&Text::new(format!("… and {} more (see the table)", points.len() - fits), (10, y), font(14.0)))?;
    }
    Ok(())
}
