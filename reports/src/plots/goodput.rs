//! Goodput against the checkpoint interval: the Monte Carlo's goodput at each interval
//! tried (points, with whiskers for the 95% confidence interval of T_s / mean T_w), Daly's
//! efficiency τ·e^{−R/M} / (M·(e^{(τ+δ)/M} − 1)) as a line through the same intervals, and
//! markers at Daly's τ_opt and at the best interval the Monte Carlo found. The x axis is
//! logarithmic (minutes), since sweeps are spaced by factors.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{DrawResult, Figure, INK, MEASURED, MUTED, PREDICTED, font, tick};
use crate::table::{Cell, Table};

/// One interval tried.
#[derive(Clone, Debug, PartialEq)]
pub struct GoodputPoint {
    pub interval_s: f64,
    pub goodput: f64,
    pub lo: f64,
    pub hi: f64,
    /// Daly's efficiency at this interval.
    pub daly: f64,
}

/// The figure's data.
#[derive(Clone, Debug, PartialEq)]
pub struct GoodputPlot {
    pub title: String,
    pub points: Vec<GoodputPoint>,
    pub daly_tau_s: f64,
    pub best_tau_s: f64,
}

/// The numbers behind the plot.
pub fn table(p: &GoodputPlot) -> Table {
    let mut t = Table::new(
        "goodput",
        "Goodput against the checkpoint interval",
        &["interval_s", "goodput", "goodput_lo95", "goodput_hi95", "daly_efficiency"],
    );
    for q in &p.points {
        t.push(vec![Cell::from(q.interval_s), q.goodput.into(), q.lo.into(), q.hi.into(), q.daly.into()]);
    }
    t
}

impl Figure for GoodputPlot {
    fn size(&self) -> (u32, u32) {
        (1000, 600)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let mins: Vec<f64> = self.points.iter().map(|p| p.interval_s / 60.0).collect();
        let (xmin, xmax) = mins.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        let xmin = (xmin.min(self.daly_tau_s / 60.0) / 1.2).max(1e-6);
        let xmax = (xmax.max(self.daly_tau_s / 60.0) * 1.2).max(xmin * 2.0);
        let ys = self.points.iter().flat_map(|p| [p.lo, p.hi, p.daly]).filter(|v| v.is_finite());
        let (ylo, yhi) = ys.fold((1.0f64, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
        let pad = ((yhi - ylo) * 0.08).max(0.002);
        let (ylo, yhi) = ((ylo - pad).max(0.0) * 100.0, (yhi + pad).min(1.0) * 100.0);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, font(20.0))
            .margin(16)
            .x_label_area_size(52)
            .y_label_area_size(70)
            .build_cartesian_2d((xmin..xmax).log_scale(), ylo..yhi)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
            .bold_line_style(RGBColor(0xDD, 0xDD, 0xDD))
            .axis_style(MUTED)
            .label_style(font(14.0))
            .axis_desc_style(font(16.0))
            .x_desc("checkpoint interval (minutes, log scale)")
            .y_desc("goodput (% of wall time training)")
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                self.points.iter().map(|p| (p.interval_s / 60.0, p.daly * 100.0)),
                PREDICTED.stroke_width(2),
            ))?
            .label("Daly (2006), exponential failures")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], PREDICTED.stroke_width(2)));
        for p in &self.points {
            let x = p.interval_s / 60.0;
            chart.draw_series([PathElement::new([(x, p.lo * 100.0), (x, p.hi * 100.0)], MEASURED.stroke_width(2))])?;
        }
        chart
            .draw_series(
                self.points.iter().map(|p| Circle::new((p.interval_s / 60.0, p.goodput * 100.0), 4, MEASURED.filled())),
            )?
            .label("Monte Carlo (whisker: 95% CI)")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, MEASURED.filled()));
        let vline = |x: f64| [(x, ylo), (x, yhi)];
        chart
            .draw_series([PathElement::new(vline(self.daly_tau_s / 60.0), PREDICTED.stroke_width(1))])?
            .label(format!("Daly τ_opt = {} min", tick(self.daly_tau_s / 60.0)))
            .legend(|(x, y)| PathElement::new([(x + 8, y - 7), (x + 8, y + 7)], PREDICTED.stroke_width(1)));
        chart
            .draw_series([PathElement::new(vline(self.best_tau_s / 60.0), INK.stroke_width(1))])?
            .label(format!("Monte Carlo best = {} min", tick(self.best_tau_s / 60.0)))
            .legend(|(x, y)| PathElement::new([(x + 8, y - 7), (x + 8, y + 7)], INK.stroke_width(1)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerMiddle)
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
    fn renders_png_and_svg_with_its_labels() {
        let points = (0..9)
            .map(|i| {
                let t = 60.0 * 2f64.powi(i);
                let g = 0.9 - 0.01 * (i as f64 - 4.0).powi(2);
                GoodputPoint { interval_s: t, goodput: g, lo: g - 0.003, hi: g + 0.003, daly: g + 0.001 }
            })
            .collect();
        let fig = GoodputPlot { title: "t".into(), points, daly_tau_s: 960.0, best_tau_s: 960.0 };
        let dir = std::env::temp_dir().join(format!("strata-goodput-plot-{}", std::process::id()));
        let r = super::super::render(&fig, "goodput", &dir).unwrap();
        assert!(r.svg.contains("Daly τ_opt = 16 min") && r.svg.contains("Monte Carlo best"), "{}", &r.svg[..200]);
        let img = image::open(&r.png).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (1000, 600));
        assert!(img.pixels().any(|p| p.0 == [MEASURED.0, MEASURED.1, MEASURED.2]), "the points are drawn");
        assert_eq!(table(&fig).to_csv().lines().count(), 10);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
