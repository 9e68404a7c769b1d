//! Predicted against measured time per op kind for one plan: horizontal grouped bars, one
//! pair per kind (`attn fwd`, `all-reduce tp`, `send act` …), with the relative error at
//! the end of each pair. Seconds are the mean per rank per step (see [`crate::op_kinds`]).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{CategoryAxis, DrawResult, Figure, MEASURED, MUTED, PREDICTED, font, nice_max, pct, tick, time_unit};
use crate::inputs::PlanComparison;
use crate::op_kinds::OpTime;
use crate::table::{Cell, Table};

pub struct OpBarsPlot {
    title: String,
    ops: Vec<OpTime>,
}

impl OpBarsPlot {
    /// The kinds with any time, in the comparison's order.
    pub fn new(p: &PlanComparison) -> OpBarsPlot {
        let ops = p.ops.iter().filter(|o| o.predicted_s > 0.0 || o.measured_s > 0.0).cloned().collect();
        OpBarsPlot { title: format!("Time per op kind: {} ({})", p.name, p.scenario.short()), ops }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The numbers behind the plot.
pub fn table(p: &PlanComparison) -> Table {
    let mut t = Table::new(
        format!("ops-{}", p.slug()),
        format!("Time per op kind, {} (mean per rank per step)", p.name),
        &["op_kind", "category", "predicted_s", "measured_s", "error_pct"],
    );
    for o in &p.ops {
        let err =
            if o.measured_s > 0.0 { Cell::Float(100.0 * (o.predicted_s / o.measured_s - 1.0)) } else { Cell::Empty };
        t.push(vec![o.kind.clone().into(), o.category.key().into(), o.predicted_s.into(), o.measured_s.into(), err]);
    }
    t
}

const ROW_PX: u32 = 30;

impl Figure for OpBarsPlot {
    fn size(&self) -> (u32, u32) {
        (1100, 150 + ROW_PX * self.ops.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let n = self.ops.len().max(1);
        let top = self.ops.iter().map(|o| o.predicted_s.max(o.measured_s)).fold(0.0, f64::max);
        let (mul, unit) = time_unit(top);
        // Room at the right end for the error label.
        let m = nice_max(top * mul * 1.12);
        let names: Vec<String> = self.ops.iter().map(|o| o.kind.clone()).collect();
        // Row i (from the top) is centred at y = n − i − 0.5.
        let label = |y: &f64| -> String {
            let i = n as i64 - 1 - y.floor() as i64;
            names.get(i.max(0) as usize).cloned().unwrap_or_default()
        };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, font(20.0))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(150)
            .build_cartesian_2d(0.0..m, CategoryAxis::new(n))?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .disable_y_mesh()
            .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
            .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
            .axis_style(MUTED)
            .label_style(font(14.0))
            .axis_desc_style(font(16.0))
            .x_desc(format!("time per rank per step ({unit})"))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&label)
            .draw()?;
        let bar = |i: usize, lo: f64, hi: f64| (n as f64 - i as f64 - 1.0 + lo, n as f64 - i as f64 - 1.0 + hi);
        chart
            .draw_series(self.ops.iter().enumerate().map(|(i, o)| {
                let (y0, y1) = bar(i, 0.52, 0.86);
                Rectangle::new([(0.0, y0), (o.predicted_s * mul, y1)], PREDICTED.filled())
            }))?
            .label("predicted (simulator)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], PREDICTED.filled()));
        chart
            .draw_series(self.ops.iter().enumerate().map(|(i, o)| {
                let (y0, y1) = bar(i, 0.14, 0.48);
                Rectangle::new([(0.0, y0), (o.measured_s * mul, y1)], MEASURED.filled())
            }))?
            .label("measured (runtime)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], MEASURED.filled()));
        chart.draw_series(self.ops.iter().enumerate().filter(|(_, o)| o.measured_s > 0.0).map(|(i, o)| {
            let x = o.predicted_s.max(o.measured_s) * mul;
            let (_, y1) = bar(i, 0.0, 0.5);
            let err = o.predicted_s / o.measured_s - 1.0;
            EmptyElement::at((x, y1)) + Text::new(pct(err), (6, -8), font(13.0).color(&MUTED))
        }))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(font(14.0))
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(0xCC, 0xCC, 0xCC))
            .draw()?;
        Ok(())
    }
}
