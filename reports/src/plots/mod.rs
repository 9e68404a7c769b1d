//! Plots, drawn with plotters into PNG and SVG from one drawing function per figure.
//!
//! Text is laid out and, in PNG, rasterised with ab_glyph from a font compiled into the
//! binary (Ubuntu Light, from `epaint_default_fonts`), so plots render on a machine with no
//! system fonts. SVG keeps text as `<text>` in the font family `Ubuntu, sans-serif`; the
//! HTML report embeds the same font, so the browser draws exactly the glyphs the layout was
//! measured with.
//!
//! Figures: [`step_time`] (predicted vs measured across plans), [`op_bars`] (per op kind),
//! [`gantt`] (the two timelines), [`memory`] (allocated bytes per rank over time),
//! [`landscape`] (search throughput over tp × pp), [`goodput`] (goodput against the checkpoint
//! interval).

pub mod gantt;
pub mod glyphs;
pub mod goodput;
pub mod landscape;
pub mod memory;
pub mod op_bars;
pub mod step_time;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::error::ReportError;
use crate::table::sig;

/// The font family every plot uses (registered under this name and as `sans-serif`, the
/// family plotters' defaults ask for).
pub const FAMILY: &str = "Ubuntu, sans-serif";

/// The embedded font's bytes (for the HTML report's `@font-face`).
pub const FONT_TTF: &[u8] = epaint_default_fonts::UBUNTU_LIGHT;

/// Registers the embedded font once per process.
pub fn ensure_font() -> Result<(), ReportError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        register_font(FAMILY, FontStyle::Normal, FONT_TTF).is_ok()
            && register_font("sans-serif", FontStyle::Normal, FONT_TTF).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ReportError::Plot { name: "font".into(), message: "the embedded font did not load".into() })
    }
}

pub(crate) type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A figure that can draw itself on any plotters backend.
pub trait Figure {
    /// Canvas size in pixels (width, height).
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// A figure written as `NAME.png` and `NAME.svg`.
#[derive(Clone, Debug)]
pub struct RenderedPlot {
    pub name: String,
    pub png: PathBuf,
    pub svg_path: PathBuf,
    /// The SVG text (what the HTML report inlines).
    pub svg: String,
}

/// Draws `fig` into `dir/NAME.png` and `dir/NAME.svg`.
pub fn render(fig: &impl Figure, name: &str, dir: &Path) -> Result<RenderedPlot, ReportError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|e| ReportError::write(dir, e))?;
    let plot_err = |e: String| ReportError::Plot { name: name.to_string(), message: e };
    let size = fig.size();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(e.to_string()))?;
        fig.draw(&root).map_err(|e| plot_err(e.to_string()))?;
        root.present().map_err(|e| plot_err(e.to_string()))?;
    }
    let png = dir.join(format!("{name}.png"));
    {
        let root = glyphs::GlyphFix(BitMapBackend::new(&png, size)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(e.to_string()))?;
        fig.draw(&root).map_err(|e| plot_err(e.to_string()))?;
        root.present().map_err(|e| plot_err(format!("{}: {e}", png.display())))?;
    }
    let svg_path = dir.join(format!("{name}.svg"));
    crate::error::write_file(&svg_path, svg.as_bytes())?;
    Ok(RenderedPlot { name: name.to_string(), png, svg_path, svg })
}

// Colours: Tableau 10, distinguishable in print and for the common colour-vision
// deficiencies when paired with line style (memory) or position (bars).
pub const PREDICTED: RGBColor = RGBColor(0x4C, 0x78, 0xA8);
pub const MEASURED: RGBColor = RGBColor(0xF5, 0x85, 0x18);
pub const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);
pub const MUTED: RGBColor = RGBColor(0x77, 0x77, 0x77);
pub const GRID: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4C, 0x78, 0xA8),
    RGBColor(0xF5, 0x85, 0x18),
    RGBColor(0x54, 0xA2, 0x4B),
    RGBColor(0xE4, 0x57, 0x56),
    RGBColor(0x72, 0xB7, 0xB2),
    RGBColor(0xEE, 0xCA, 0x3B),
    RGBColor(0xB2, 0x79, 0xA2),
    RGBColor(0xFF, 0x9D, 0xA6),
    RGBColor(0x9D, 0x75, 0x5D),
    RGBColor(0xBA, 0xB0, 0xAC),
];

/// A text style of the embedded font.
pub(crate) fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&INK)
}

/// A tick label: four significant digits, trailing zeros trimmed (`0.25`, `12`, `1.5k`
/// is not used — axes carry their unit in the description instead).
pub(crate) fn tick(v: f64) -> String {
    if v.abs() < 1e-12 {
        return "0".to_string();
    }
    let s = sig(v, 4);
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// A unit for times up to `max_s`: (multiplier from seconds, name).
pub(crate) fn time_unit(max_s: f64) -> (f64, &'static str) {
    if max_s >= 1.0 {
        (1.0, "s")
    } else if max_s >= 1e-3 {
        (1e3, "ms")
    } else if max_s >= 1e-6 {
        (1e6, "µs")
    } else {
        (1e9, "ns")
    }
}

/// A binary unit for byte counts up to `max`: (divisor, name).
pub(crate) fn bytes_unit(max: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] = [
        (1024.0 * 1024.0 * 1024.0 * 1024.0, "TiB"),
        (1024.0 * 1024.0 * 1024.0, "GiB"),
        (1024.0 * 1024.0, "MiB"),
        (1024.0, "KiB"),
    ];
    for (d, name) in UNITS {
        if max >= 2.0 * d {
            return (d, name);
        }
    }
    (1.0, "B")
}

/// A short signed percentage: `+3.1%`, `−12%`.
pub(crate) fn pct(x: f64) -> String {
    let v = x * 100.0;
    let s = if v.abs() >= 10.0 { format!("{:.0}", v.abs()) } else { format!("{:.1}", v.abs()) };
    if v < 0.0 { format!("−{s}%") } else { format!("+{s}%") }
}

/// A nice upper bound for an axis starting at 0: 1, 2, 2.5 or 5 × 10^k above `v`.
pub(crate) fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// An axis of `n` categories: values in [0, n), category i spans [i, i + 1), ticks at the
/// centres i + 0.5 (labelled by the chart's formatter), and no light grid lines.
#[derive(Clone)]
pub(crate) struct CategoryAxis {
    inner: RangedCoordf64,
    n: usize,
}

impl CategoryAxis {
    pub(crate) fn new(n: usize) -> CategoryAxis {
        let n = n.max(1);
        CategoryAxis { inner: (0.0..n as f64).into(), n }
    }
}

impl Ranged for CategoryAxis {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.n as f64
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Every category is labelled: the figures size themselves so each has a row.
        if hint.weight().allow_light_points() { Vec::new() } else { (0..self.n).map(|i| i as f64 + 0.5).collect() }
    }
}

/// Draws a legend row of colour swatches with labels, left to right, starting at (x, y).
pub(crate) fn swatch_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(RGBColor, String)],
    (x0, y): (i32, i32),
    size: f64,
) -> DrawResult<DB> {
    let style = font(size);
    let mut x = x0;
    let (w, _) = area.dim_in_pixel();
    let mut y = y;
    for (color, label) in items {
        let (tw, _) = area.estimate_text_size(label, &style)?;
        let item_w = 18 + tw as i32 + 22;
        if x + item_w > w as i32 - 10 && x > x0 {
            x = x0;
            y += (size * 1.6) as i32;
        }
        area.draw(&Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()))?;
        area.draw(&Text::new(label.clone(), (x + 18, y - (size * 0.55) as i32), style.clone()))?;
        x += item_w;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_units_read_well() {
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(12.0), "12");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(time_unit(0.5), (1e3, "ms"));
        assert_eq!(time_unit(0.004), (1e3, "ms"));
        assert_eq!(time_unit(0.0009), (1e6, "µs"));
        assert_eq!(time_unit(12.0), (1.0, "s"));
        assert_eq!(bytes_unit(3.0 * 1024.0 * 1024.0).1, "MiB");
        assert_eq!(pct(-0.1234), "−12%");
        assert_eq!(pct(0.031), "+3.1%");
        assert_eq!(nice_max(7.3), 8.0);
        assert!((nice_max(0.011) - 0.012).abs() < 1e-15);
    }
}
