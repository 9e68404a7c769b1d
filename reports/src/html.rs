//! The report as one self-contained HTML page: inline CSS, the plots as inline SVG, the
//! embedded font as a `data:` URL, and under every plot the table of the numbers behind it.
//! No script, no external URL: it reads the same offline, printed, or mailed.
//!
//! The page is a pure function of its sections, so the same inputs give the same bytes.

use std::fmt::Write;

use crate::plots::{FONT_TTF, bytes_unit, time_unit};
use crate::table::{Cell, Table, sig};

/// A plot with what explains it.
pub struct Block {
    /// The plot's SVG text (from [`crate::plots::render`]); empty for a table-only block.
    pub svg: String,
    pub caption: String,
    /// Tables shown in the page.
    pub tables: Vec<Table>,
    /// Files next to the report: (relative path, what it is).
    pub links: Vec<(String, String)>,
}

/// A titled part of the page.
pub struct Section {
    pub id: String,
    pub title: String,
    /// A paragraph of plain text.
    pub intro: String,
    pub blocks: Vec<Block>,
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Standard base64 (RFC 4648) with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An SVG from plotters, ready to inline: the XML namespace attribute (a URL the HTML
/// parser does not need) is dropped and the size made responsive.
pub fn inline_svg(svg: &str) -> String {
    let svg = svg.replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1);
    let svg = svg.replacen(" xmlns:xlink=\"http://www.w3.org/1999/xlink\"", "", 1);
    match svg.find("<svg") {
        Some(i) => svg[i..].trim_end().to_string(),
        None => svg.trim_end().to_string(),
    }
}

const CSS: &str = r#"
:root { --ink: #222; --muted: #666; --rule: #ddd; --band: #f6f7f9; --accent: #4c78a8; }
* { box-sizing: border-box; }
body { margin: 0; font-family: Ubuntu, sans-serif; color: var(--ink); background: #fff; line-height: 1.45; }
main { max-width: 1360px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 28px; font-weight: normal; margin: 8px 0 4px; }
h2 { font-size: 22px; font-weight: normal; margin: 40px 0 8px; padding-top: 12px; border-top: 2px solid var(--rule); }
h3 { font-size: 16px; font-weight: bold; margin: 18px 0 6px; }
p { margin: 6px 0 12px; max-width: 80em; }
.muted { color: var(--muted); }
nav ol { columns: 2; margin: 8px 0 0; padding-left: 20px; }
nav a, a { color: var(--accent); }
figure { margin: 16px 0; }
figure svg { display: block; max-width: 100%; height: auto; border: 1px solid var(--rule); }
figcaption { color: var(--muted); font-size: 14px; margin-top: 6px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
caption { text-align: left; font-weight: bold; padding: 4px 0; white-space: nowrap; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--rule); text-align: left; white-space: nowrap; }
th { background: var(--band); font-weight: bold; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) td { background: #fbfbfc; }
.scroll { overflow-x: auto; max-height: 480px; overflow-y: auto; }
.summary td:first-child { font-weight: bold; }
ul.files { font-size: 14px; }
"#;

/// The whole page.
pub fn page(title: &str, lead: &str, summary: &Table, sections: &[Section]) -> String {
    let mut h = String::new();
    let w = &mut h;
    w.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    w.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    writeln!(w, "<title>{}</title>", escape(title)).expect("write to String");
    w.push_str("<style>\n@font-face { font-family: Ubuntu; font-style: normal; font-weight: 400; src: url(data:font/ttf;base64,");
    w.push_str(&base64(FONT_TTF));
    w.push_str(") format(\"truetype\"); }");
    w.push_str(CSS);
    w.push_str("</style>\n</head>\n<body>\n<main>\n");
    writeln!(w, "<h1>{}</h1>\n<p class=\"muted\">{}</p>", escape(title), escape(lead)).expect("write to String");
    w.push_str(&table_html(summary, "summary"));
    w.push_str("<nav><ol>\n");
    for s in sections {
        writeln!(w, "<li><a href=\"#{}\">{}</a></li>", escape(&s.id), escape(&s.title)).expect("write to String");
    }
    w.push_str("</ol></nav>\n");
    for s in sections {
        section_html(w, s);
    }
    w.push_str("</main>\n</body>\n</html>\n");
    h
}

fn section_html(w: &mut String, s: &Section) {
    writeln!(w, "<section id=\"{}\">\n<h2>{}</h2>", escape(&s.id), escape(&s.title)).expect("write to String");
    if !s.intro.is_empty() {
        writeln!(w, "<p>{}</p>", escape(&s.intro)).expect("write to String");
    }
    for b in &s.blocks {
        if !b.svg.is_empty() {
            w.push_str("<figure>\n");
            w.push_str(&inline_svg(&b.svg));
            writeln!(w, "\n<figcaption>{}</figcaption>\n</figure>", escape(&b.caption)).expect("write to String");
        } else if !b.caption.is_empty() {
            writeln!(w, "<p>{}</p>", escape(&b.caption)).expect("write to String");
        }
        for t in &b.tables {
            w.push_str(&table_html(t, ""));
        }
        if !b.links.is_empty() {
            w.push_str("<ul class=\"files\">\n");
            for (href, what) in &b.links {
                writeln!(w, "<li><a href=\"{}\">{}</a> — {}</li>", escape(href), escape(href), escape(what))
                    .expect("write to String");
            }
            w.push_str("</ul>\n");
        }
    }
    w.push_str("</section>\n");
}

/// A table with its id (`table-<id>`), a caption, and a link to its CSV.
pub fn table_html(t: &Table, class: &str) -> String {
    let mut w = String::new();
    let class = if class.is_empty() { String::new() } else { format!(" class=\"{class}\"") };
    writeln!(w, "<div class=\"scroll\"><table id=\"table-{}\"{class}>", escape(&t.id)).expect("write to String");
    writeln!(
        w,
        "<caption>{} <span class=\"muted\">(<a href=\"{}.csv\">{}.csv</a>)</span></caption>",
        escape(&t.title),
        escape(&t.id),
        escape(&t.id)
    )
    .expect("write to String");
    let formats: Vec<ColumnFormat> = (0..t.columns.len()).map(|i| ColumnFormat::of(t, i)).collect();
    w.push_str("<thead><tr>");
    for (c, f) in t.columns.iter().zip(&formats) {
        write!(w, "<th>{}</th>", escape(&f.header(c))).expect("write to String");
    }
    w.push_str("</tr></thead>\n<tbody>\n");
    for row in &t.rows {
        w.push_str("<tr>");
        for (c, f) in row.iter().zip(&formats) {
            let class = if c.is_numeric() { " class=\"n\"" } else { "" };
            write!(w, "<td{class}>{}</td>", escape(&f.cell(c))).expect("write to String");
        }
        w.push_str("</tr>\n");
    }
    w.push_str("</tbody></table></div>\n");
    w
}

/// How a column reads in the page. CSV keeps SI units (`_s` seconds, `_bytes` bytes,
/// `_pct` percent); the page shows each column in a unit that suits its largest value.
enum ColumnFormat {
    Plain,
    /// Seconds shown as (multiplier, unit).
    Time(f64, &'static str),
    Bytes(f64, &'static str),
    Percent,
}

impl ColumnFormat {
    fn of(t: &Table, i: usize) -> ColumnFormat {
        let name = &t.columns[i];
        let max = t
            .rows
            .iter()
            .filter_map(|r| match r[i] {
                Cell::Float(v) => Some(v.abs()),
                Cell::Int(v) => Some(v.unsigned_abs() as f64),
                _ => None,
            })
            .fold(0.0, f64::max);
        if name.ends_with("_s") {
            let (mul, unit) = time_unit(max);
            ColumnFormat::Time(mul, unit)
        } else if name.ends_with("_bytes") {
            let (div, unit) = bytes_unit(max);
            ColumnFormat::Bytes(div, unit)
        } else if name.ends_with("_pct") {
            ColumnFormat::Percent
        } else {
            ColumnFormat::Plain
        }
    }

    /// `predicted_s` → `predicted (ms)`, `error_pct` → `error (%)`.
    fn header(&self, name: &str) -> String {
        let base = |suffix: &str| name.strip_suffix(suffix).unwrap_or(name).replace('_', " ");
        match self {
            ColumnFormat::Plain => name.replace('_', " "),
            ColumnFormat::Time(_, unit) => format!("{} ({unit})", base("_s")),
            ColumnFormat::Bytes(_, unit) => format!("{} ({unit})", base("_bytes")),
            ColumnFormat::Percent => format!("{} (%)", base("_pct")),
        }
    }

    fn cell(&self, c: &Cell) -> String {
        let v = match c {
            Cell::Float(v) => *v,
            Cell::Int(i) => *i as f64,
            other => return other.display(),
        };
        match self {
            ColumnFormat::Plain => c.display(),
            ColumnFormat::Time(mul, _) => sig(v * mul, 4),
            ColumnFormat::Bytes(div, _) => sig(v / div, 4),
            ColumnFormat::Percent if v.abs() < 0.05 => "0.0".to_string(),
            ColumnFormat::Percent => format!("{v:+.1}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, enc) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }

    #[test]
    fn columns_read_in_their_units() {
        let mut t = Table::new("x", "X", &["plan", "step_s", "peak_bytes", "error_pct"]);
        t.push(vec!["a".into(), 0.0123.into(), Cell::from(3 * 1024 * 1024_u64), (-4.44).into()]);
        let html = table_html(&t, "");
        assert!(html.contains("<th>step (ms)</th><th>peak (MiB)</th><th>error (%)</th>"), "{html}");
        assert!(
            html.contains("<td class=\"n\">12.30</td><td class=\"n\">3.000</td><td class=\"n\">-4.4</td>"),
            "{html}"
        );
    }

    #[test]
    fn escape_and_inline_svg() {
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        let svg = "<?xml version=\"1.0\"?>\n<svg width=\"10\" xmlns=\"http://www.w3.org/2000/svg\">\n</svg>\n";
        assert_eq!(inline_svg(svg), "<svg width=\"10\">\n</svg>");
    }
}
