//! The tables behind the plots: one type, written as CSV next to the report and as an HTML
//! table inside it.
//!
//! Numbers keep full precision in CSV (Rust's shortest round-trip form of an `f64`, which
//! is deterministic) and are shown with four significant digits in HTML.

use std::path::Path;

use crate::error::{ReportError, write_file};

/// One cell.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Text(String),
    Int(i64),
    Float(f64),
    /// No value (an out-of-memory cell's throughput, a rank missing from one side).
    Empty,
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}
impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}
impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        Cell::Int(v as i64)
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Cell {
        Cell::Int(v as i64)
    }
}
impl From<f64> for Cell {
    fn from(v: f64) -> Cell {
        Cell::Float(v)
    }
}
impl From<Option<f64>> for Cell {
    fn from(v: Option<f64>) -> Cell {
        v.map_or(Cell::Empty, Cell::Float)
    }
}

impl Cell {
    /// Full precision, for CSV.
    pub fn csv(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(i) => i.to_string(),
            Cell::Float(v) => format!("{v}"),
            Cell::Empty => String::new(),
        }
    }

    /// Four significant digits, for reading.
    pub fn display(&self) -> String {
        match self {
            Cell::Float(v) => sig(*v, 4),
            Cell::Empty => "–".to_string(),
            other => other.csv(),
        }
    }

    pub fn is_numeric(&self) -> bool {
        matches!(self, Cell::Int(_) | Cell::Float(_))
    }
}

/// `v` with `digits` significant digits in fixed notation (`0.01235`, `12346`, `1.5`).
pub fn sig(v: f64, digits: i32) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor() as i32;
    let decimals = (digits - 1 - mag).clamp(0, 12) as usize;
    format!("{v:.decimals$}")
}

/// A titled table with a file name.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// File stem of its CSV, and the HTML anchor (`step-time`, `ops-tp2-pp2`).
    pub id: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(id: impl Into<String>, title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            id: id.into(),
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        assert_eq!(
            row.len(),
            self.columns.len(),
            "table {}: row of {} cells for {:?}",
            self.id,
            row.len(),
            self.columns
        );
        self.rows.push(row);
    }

    /// The table as CSV text (RFC 4180 quoting, `\n` line ends).
    pub fn to_csv(&self) -> String {
        let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
        w.write_record(&self.columns).expect("CSV into memory");
        for row in &self.rows {
            w.write_record(row.iter().map(Cell::csv)).expect("CSV into memory");
        }
        String::from_utf8(w.into_inner().expect("CSV into memory")).expect("CSV of UTF-8 cells")
    }

    pub fn write_csv(&self, dir: &Path) -> Result<std::path::PathBuf, ReportError> {
        let path = dir.join(format!("{}.csv", self.id));
        write_file(&path, self.to_csv().as_bytes())?;
        Ok(path)
    }
}
