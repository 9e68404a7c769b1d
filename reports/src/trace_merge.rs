//! The predicted and the measured trace of one plan in one Chrome/Perfetto file, so that
//! both timelines sit side by side in ui.perfetto.dev.
//!
//! Input: two Trace Event Format files as [`crate::chrome_trace`] writes them (`strata
//! simulate --trace`, `strata train --out DIR` → `DIR/trace.json`), one process per rank
//! with `pid` = rank + 1. Output: the predicted processes keep their pids; the measured
//! ones move past them (`pid` + the largest predicted pid), so no pid is shared. Every
//! process is named `predicted rank N: <label>` or `measured rank N: <label>` and sorted
//! predicted rank 0, measured rank 0, predicted rank 1, …. Both files must describe the
//! same plan (grid and scenario in `otherData`, where present) and the right sources
//! (`simulated`, `measured`).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::error::ReportError;

/// Which side of the comparison a trace is.
#[derive(Clone, Copy)]
enum Side {
    Predicted,
    Measured,
}

impl Side {
    fn key(self) -> &'static str {
        match self {
            Side::Predicted => "predicted",
            Side::Measured => "measured",
        }
    }

    /// The `otherData.source` a trace of this side carries.
    fn source(self) -> &'static str {
        match self {
            Side::Predicted => "simulated",
            Side::Measured => "measured",
        }
    }
}

/// One parsed input: its `otherData` and its events.
struct Input {
    other: Map<String, Value>,
    events: Vec<Value>,
}

fn parse(name: &str, text: &str, side: Side) -> Result<Input, ReportError> {
    let bad = |m: String| ReportError::invalid(name, m);
    let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(mut top) = v else {
        return Err(bad("not a Chrome/Perfetto trace (the top level is not an object)".into()));
    };
    let Some(Value::Array(events)) = top.remove("traceEvents") else {
        return Err(bad(
            "not a Chrome/Perfetto trace (no traceEvents array); pass the trace.json of `strata train --out` or the file of `strata simulate --trace`".into(),
        ));
    };
    let other = match top.remove("otherData") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if let Some(src) = other.get("source").and_then(Value::as_str)
        && src != side.source()
    {
        return Err(bad(format!(
            "a {src} trace given as the {} one; pass the predicted (simulated) trace first, then the measured one",
            side.key()
        )));
    }
    for (i, e) in events.iter().enumerate() {
        if e.get("pid").is_some_and(|p| p.as_u64().is_none()) {
            return Err(bad(format!("event {i} has pid {}, not a non-negative integer", e["pid"])));
        }
    }
    Ok(Input { other, events })
}

fn pid_of(e: &Value) -> Option<u64> {
    e.get("pid").and_then(Value::as_u64)
}

/// Merges `predicted` (named `pred_name` in errors) and `measured` into one trace file.
pub fn merge_traces(pred_name: &str, predicted: &str, meas_name: &str, measured: &str) -> Result<String, ReportError> {
    let p = parse(pred_name, predicted, Side::Predicted)?;
    let m = parse(meas_name, measured, Side::Measured)?;
    for key in ["grid", "scenario"] {
        if let (Some(a), Some(b)) = (p.other.get(key), m.other.get(key))
            && a != b
        {
            return Err(ReportError::invalid(
                meas_name,
                format!("{key} {b} differs from the predicted trace's {a} ({pred_name}); merge the traces of one plan"),
            ));
        }
    }
    let offset = p.events.iter().filter_map(pid_of).max().unwrap_or(0).max(1);
    let mut events = Vec::new();
    for (side, input, shift) in [(Side::Predicted, &p, 0), (Side::Measured, &m, offset)] {
        let mut named = BTreeSet::new();
        let mut pids = BTreeSet::new();
        for e in &input.events {
            let mut e = e.clone();
            if let Some(pid) = pid_of(&e) {
                pids.insert(pid);
                let rank = pid.saturating_sub(1);
                e["pid"] = json!(pid + shift);
                match e.get("name").and_then(Value::as_str) {
                    Some("process_name") if e.get("ph").and_then(Value::as_str) == Some("M") => {
                        let label = e.pointer("/args/name").and_then(Value::as_str).unwrap_or("").to_string();
                        e["args"] = json!({ "name": process_label(side, rank, &label) });
                        named.insert(pid);
                    }
                    Some("process_sort_index") if e.get("ph").and_then(Value::as_str) == Some("M") => {
                        e["args"] = json!({ "sort_index": sort_index(side, rank) });
                    }
                    _ => {}
                }
            }
            events.push(e);
        }
        for pid in pids.difference(&named) {
            let rank = pid.saturating_sub(1);
            events.push(json!({"args": {"name": process_label(side, rank, "")}, "name": "process_name", "ph": "M", "pid": pid + shift, "tid": 0}));
        }
    }
    let other = json!({ "predicted": p.other, "measured": m.other, "measured_pid_offset": offset });
    let mut out = format!("{{\"displayTimeUnit\":\"ms\",\"otherData\":{other},\n\"traceEvents\":[\n");
    for (i, e) in events.iter().enumerate() {
        out += &e.to_string();
        out += if i + 1 < events.len() { ",\n" } else { "\n" };
    }
    out += "]}\n";
    Ok(out)
}

fn process_label(side: Side, rank: u64, label: &str) -> String {
    if label.is_empty() {
        format!("{} rank {rank}", side.key())
    } else {
        format!("{} rank {rank}: {label}", side.key())
    }
}

fn sort_index(side: Side, rank: u64) -> u64 {
    2 * rank + matches!(side, Side::Measured) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(source: &str, ranks: u64) -> String {
        let mut ev = Vec::new();
        for r in 0..ranks {
            ev.push(json!({"args":{"name":format!("rank({r})")},"name":"process_name","ph":"M","pid":r+1,"tid":0}));
            ev.push(json!({"args":{"sort_index":r},"name":"process_sort_index","ph":"M","pid":r+1,"tid":0}));
            ev.push(json!({"args":{},"name":"op","ph":"X","pid":r+1,"tid":1,"ts":0.0,"dur":1.0}));
        }
        json!({"otherData":{"source":source,"grid":"g"},"traceEvents":ev}).to_string()
    }

    #[test]
    fn pids_are_distinct_and_processes_named() {
        let out = merge_traces("p", &trace("simulated", 2), "m", &trace("measured", 2)).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let names: Vec<(u64, String)> = ev
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(
            names,
            [
                (1, "predicted rank 0: rank(0)".to_string()),
                (2, "predicted rank 1: rank(1)".to_string()),
                (3, "measured rank 0: rank(0)".to_string()),
                (4, "measured rank 1: rank(1)".to_string())
            ]
        );
        assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count(), 4);
    }

    #[test]
    fn swapped_or_foreign_inputs_are_refused() {
        let e = merge_traces("p", &trace("measured", 1), "m", &trace("measured", 1)).unwrap_err().to_string();
        assert!(e.contains("predicted (simulated) trace first"), "{e}");
        let e = merge_traces("p", "{\"spans\":[]}", "m", &trace("measured", 1)).unwrap_err().to_string();
        assert!(e.contains("p:") && e.contains("traceEvents"), "{e}");
    }
}
