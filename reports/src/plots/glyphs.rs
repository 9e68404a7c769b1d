//! Text for bitmap plots, drawn glyph by glyph with ab_glyph.
//!
//! plotters 0.3.7 places each glyph's rasterised outline at the pen position without the
//! glyph's left side bearing (`px_bounds().min.x`), so letters drift and words look
//! unevenly spaced ("ban d"). [`GlyphFix`] wraps a backend and draws text itself with the
//! bearing applied; everything else goes to the wrapped backend. The horizontal advance
//! and kerning are plotters' own, so the layout that plotters measured (label areas,
//! legend boxes, anchors) still fits; the vertical placement is also plotters' (baseline
//! at half the font size below the top of the layout box).

use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind};

use super::FONT_TTF;

fn font() -> &'static FontRef<'static> {
    static FONT: OnceLock<FontRef<'static>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_TTF).expect("the embedded font parses (checked by ensure_font)"))
}

/// A backend whose text is drawn with the side bearing of each glyph.
pub struct GlyphFix<B: DrawingBackend>(pub B);

type Res<B> = Result<(), DrawingErrorKind<<B as DrawingBackend>::ErrorType>>;

impl<B: DrawingBackend> DrawingBackend for GlyphFix<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }
    fn ensure_prepared(&mut self) -> Res<B> {
        self.0.ensure_prepared()
    }
    fn present(&mut self) -> Res<B> {
        self.0.present()
    }
    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Res<B> {
        self.0.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(&mut self, from: BackendCoord, to: BackendCoord, style: &S) -> Res<B> {
        self.0.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(&mut self, ul: BackendCoord, br: BackendCoord, style: &S, fill: bool) -> Res<B> {
        self.0.draw_rect(ul, br, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, path: I, style: &S) -> Res<B> {
        self.0.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(&mut self, c: BackendCoord, r: u32, style: &S, fill: bool) -> Res<B> {
        self.0.draw_circle(c, r, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, vert: I, style: &S) -> Res<B> {
        self.0.fill_polygon(vert, style)
    }
    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Res<B> {
        self.0.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: BackendTextStyle>(&mut self, text: &str, style: &S, pos: BackendCoord) -> Res<B> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) =
            style.layout_box(text).map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        let size = style.size() as f32;
        let scaled = font().as_scaled(size);
        let mut pen = 0f32;
        let mut prev = None;
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = prev {
                pen += scaled.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(size, ab_glyph::point(pen, 0.0));
            if let Some(outline) = scaled.outline_glyph(glyph) {
                let rect = outline.px_bounds();
                let (gx, gy) = (rect.min.x.round() as i32, (size / 2.0 + rect.min.y) as i32);
                let mut pixels = Vec::new();
                outline.draw(|x, y, a| pixels.push((x as i32 + gx, y as i32 + gy, a)));
                for (x, y, a) in pixels {
                    let (x, y) = trans.transform(x + dx - min_x, y + dy - min_y);
                    let (x, y) = (pos.0 + x, pos.1 + y);
                    if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 && a > 0.0 {
                        let c = BackendColor { alpha: color.alpha * a.min(1.0) as f64, rgb: color.rgb };
                        self.0.draw_pixel((x, y), c)?;
                    }
                }
            }
            pen += scaled.h_advance(id);
        }
        Ok(())
    }
}
