//! A [`Trace`] as Chrome / Perfetto JSON (the Trace Event Format), for chrome://tracing and
//! ui.perfetto.dev.
//!
//! Layout: one process per rank (`pid` = rank + 1, since Perfetto reserves pid 0 for the
//! kernel's idle task; named with the grid label `TP(2)-PP(2)-DP(2)-rank(3)` and sorted by
//! rank), one thread per stream (`tid` 1 compute, 2 tp, 3 dp, 4 pp; see [`assign_lanes`] for
//! the extra threads that keep slices nested), each op a complete
//! event (`"ph":"X"`) named like `attn fwd L3` with its microbatch, chunk, layer, bytes,
//! FLOPs, piece and phase in `args`, and the rank's allocated bytes as a counter track
//! (`"ph":"C"`, name `memory`).
//!
//! Timestamps are microseconds, as the format requires; the trace's integer nanoseconds are
//! written as exact decimals with three places (`12.345`), so no precision is lost. The
//! bytes are deterministic: events in a fixed order, object keys sorted, no floats printed
//! through a float formatter.

use std::collections::BTreeMap;
use std::fmt::Write;

use strata_models::plan::{CollPurpose, OpKind, Peer, Plan, Stream};
use strata_models::trace::{Span, Trace, TraceSource};

use crate::op_kinds::{OpKindKey, op_name, p2p_key};

/// A value in an event's `args`.
enum Arg {
    Int(u64),
    Str(String),
}

/// Nanoseconds as microseconds with three exact decimals.
pub fn ns_to_us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

fn source_key(s: TraceSource) -> &'static str {
    match s {
        TraceSource::Simulated => "simulated",
        TraceSource::Measured => "measured",
    }
}

/// The trace as Trace Event Format JSON (one event a line, for readable diffs).
pub fn chrome_trace_json(plan: &Plan, trace: &Trace) -> String {
    let mut ranks: Vec<u32> = trace.ranks.iter().copied().chain(trace.spans.iter().map(|s| s.rank)).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut spans: Vec<&Span> = trace.spans.iter().collect();
    spans.sort_by_key(|s| (s.rank, s.stream, s.start_ns, std::cmp::Reverse(s.end_ns), s.op));
    let lanes = assign_lanes(&spans);
    let mut lane_count: BTreeMap<(u32, Stream), u64> = BTreeMap::new();
    for (s, lane) in spans.iter().zip(&lanes) {
        let n = lane_count.entry((s.rank, s.stream)).or_insert(1);
        *n = (*n).max(lane + 1);
    }
    let mut events: Vec<String> = Vec::new();
    for &rank in &ranks {
        let pid = rank as u64 + 1;
        events.push(meta(pid, 0, "process_name", Arg::Str(plan.grid.label(rank))));
        events.push(meta(pid, 0, "process_sort_index", Arg::Int(rank as u64)));
        for stream in Stream::ALL {
            for lane in 0..lane_count.get(&(rank, stream)).copied().unwrap_or(1) {
                let name =
                    if lane == 0 { stream.key().to_string() } else { format!("{} ({})", stream.key(), lane + 1) };
                let tid = tid(stream, lane);
                events.push(meta(pid, tid, "thread_name", Arg::Str(name)));
                events.push(meta(pid, tid, "thread_sort_index", Arg::Int(stream.index() as u64 * 1000 + lane)));
            }
        }
    }
    for (s, lane) in spans.iter().zip(&lanes) {
        events.push(slice(plan, s, tid(s.stream, *lane)));
    }
    let mut memory = trace.memory.clone();
    memory.sort_by_key(|m| (m.rank, m.t_ns, m.bytes));
    for m in &memory {
        events.push(format!(
            r#"{{"args":{{"bytes":{}}},"name":"memory","ph":"C","pid":{},"ts":{}}}"#,
            m.bytes,
            m.rank as u64 + 1,
            ns_to_us(m.t_ns)
        ));
    }
    let mut out = String::with_capacity(events.iter().map(|e| e.len() + 2).sum::<usize>() + 256);
    write!(
        out,
        "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"grid\":{},\"scenario\":{},\"seed\":{},\"source\":\"{}\",\"step\":{}}},\n\"traceEvents\":[\n",
        json_str(&plan.grid.to_string()),
        json_str(&plan.scenario.name),
        trace.seed,
        source_key(trace.source),
        trace.step
    )
    .expect("write to String");
    for (i, e) in events.iter().enumerate() {
        out += e;
        out += if i + 1 < events.len() { ",\n" } else { "\n" };
    }
    out += "]}\n";
    out
}

/// Thread id of a stream's lane: 1–4 for the streams themselves, then 1000·(stream + 1) +
/// lane for overflow lanes.
fn tid(stream: Stream, lane: u64) -> u64 {
    if lane == 0 { stream.index() as u64 + 1 } else { 1000 * (stream.index() as u64 + 1) + lane }
}

/// Lane of each span within its (rank, stream). The Trace Event Format wants the complete
/// events of one thread properly nested; a send, which stays open until its message is
/// delivered while its stream runs on, can overlap the next op only partially. Such a span
/// moves to the first lane where it nests, and lanes beyond the first become threads of
/// their own (`pp (2)`). `spans` must be sorted by (rank, stream, start, end descending).
fn assign_lanes(spans: &[&Span]) -> Vec<u64> {
    let mut out = Vec::with_capacity(spans.len());
    // Per lane, the ends of the open (enclosing) spans, innermost last.
    let mut open: Vec<Vec<u64>> = Vec::new();
    let mut key = None;
    for s in spans {
        if key != Some((s.rank, s.stream)) {
            key = Some((s.rank, s.stream));
            open.clear();
        }
        let mut lane = 0;
        loop {
            if lane == open.len() {
                open.push(Vec::new());
            }
            let stack = &mut open[lane];
            while stack.last().is_some_and(|&end| end <= s.start_ns) {
                stack.pop();
            }
            if stack.last().is_none_or(|&end| s.end_ns <= end) {
                stack.push(s.end_ns);
                break;
            }
            lane += 1;
        }
        out.push(lane as u64);
    }
    out
}

fn meta(pid: u64, tid: u64, name: &str, value: Arg) -> String {
    let key = if name.ends_with("sort_index") { "sort_index" } else { "name" };
    format!(r#"{{"args":{{{}:{}}},"name":"{name}","ph":"M","pid":{pid},"tid":{tid}}}"#, json_str(key), arg_json(&value))
}

fn arg_json(a: &Arg) -> String {
    match a {
        Arg::Int(i) => i.to_string(),
        Arg::Str(s) => json_str(s),
    }
}

fn slice(plan: &Plan, s: &Span, tid: u64) -> String {
    let op = &plan.program(s.rank).ops[s.op as usize];
    let args = op_args(plan, s, &op.kind);
    let args: Vec<String> = args.iter().map(|(k, v)| format!("{}:{}", json_str(k), arg_json(v))).collect();
    format!(
        r#"{{"args":{{{}}},"cat":"{}","dur":{},"name":{},"ph":"X","pid":{},"tid":{},"ts":{}}}"#,
        args.join(","),
        OpKindKey::of(op).category().key(),
        ns_to_us(s.end_ns - s.start_ns),
        json_str(&op_name(op)),
        s.rank as u64 + 1,
        tid,
        ns_to_us(s.start_ns)
    )
}

/// The op's fields, keys sorted (a `BTreeMap`).
fn op_args(plan: &Plan, s: &Span, kind: &OpKind) -> BTreeMap<&'static str, Arg> {
    use Arg::{Int, Str};
    let mut a = BTreeMap::new();
    a.insert("op", Int(s.op as u64));
    match kind {
        OpKind::Compute(c) => {
            let cost = plan.cost(c.cost);
            a.insert("microbatch", Int(c.mb as u64));
            a.insert("chunk", Int(c.chunk as u64));
            a.insert("layer", Int(c.layer as u64));
            a.insert("bytes", Int(cost.mem_bytes));
            a.insert("flops", Int(cost.flops));
            a.insert("piece", Str(c.piece.key().to_string()));
            a.insert("phase", Str(c.phase.key().to_string()));
        }
        OpKind::Collective(c) => {
            a.insert("collective", Str(c.kind.key().to_string()));
            a.insert("group", Str(c.group.key().to_string()));
            a.insert("bytes", Int(c.bytes));
            a.insert("dtype", Str(c.dtype.key().to_string()));
            purpose_args(&c.purpose, &mut a);
        }
        OpKind::Send(p) | OpKind::Recv(p) => {
            let peer = match p.peer {
                Peer::Next => "next",
                Peer::Prev => "prev",
            };
            a.insert("peer", Str(peer.to_string()));
            a.insert("message", Str(p2p_key(p.kind).to_string()));
            a.insert("microbatch", Int(p.mb as u64));
            a.insert("vstage", Int(p.vstage as u64));
            a.insert("bytes", Int(p.bytes));
        }
        OpKind::Alloc(al) => {
            a.insert("buffer", Int(al.buf as u64));
            a.insert("class", Str(al.class.key().to_string()));
            a.insert("bytes", Int(al.bytes));
        }
        OpKind::Free { buf } => {
            a.insert("buffer", Int(*buf as u64));
        }
    }
    a
}

fn purpose_args(p: &CollPurpose, a: &mut BTreeMap<&'static str, Arg>) {
    use Arg::{Int, Str};
    let purpose = match p {
        CollPurpose::Tp { piece, phase, mb, chunk, layer, .. } => {
            a.insert("piece", Str(piece.key().to_string()));
            a.insert("phase", Str(phase.key().to_string()));
            a.insert("microbatch", Int(*mb as u64));
            a.insert("chunk", Int(*chunk as u64));
            a.insert("layer", Int(*layer as u64));
            "tensor-parallel"
        }
        CollPurpose::GradBucket { chunk, bucket, mb } => {
            a.insert("chunk", Int(*chunk as u64));
            a.insert("bucket", Int(*bucket as u64));
            a.insert("microbatch", Int(*mb as u64));
            "gradient bucket"
        }
        CollPurpose::ExpertGradBucket { chunk, bucket, mb } => {
            a.insert("chunk", Int(*chunk as u64));
            a.insert("bucket", Int(*bucket as u64));
            a.insert("microbatch", Int(*mb as u64));
            "expert gradient bucket"
        }
        CollPurpose::Moe { dispatch, phase, mb, chunk, layer } => {
            a.insert("phase", Str(phase.key().to_string()));
            a.insert("microbatch", Int(*mb as u64));
            a.insert("chunk", Int(*chunk as u64));
            a.insert("layer", Int(*layer as u64));
            if *dispatch { "expert dispatch" } else { "expert combine" }
        }
        CollPurpose::Cp { phase, mb, chunk, layer, step } => {
            a.insert("phase", Str(phase.key().to_string()));
            a.insert("microbatch", Int(*mb as u64));
            a.insert("chunk", Int(*chunk as u64));
            a.insert("layer", Int(*layer as u64));
            a.insert("step", Int(*step as u64));
            "context parallel"
        }
        CollPurpose::ParamBucket { chunk, bucket } => {
            a.insert("chunk", Int(*chunk as u64));
            a.insert("bucket", Int(*bucket as u64));
            "parameter bucket"
        }
        CollPurpose::ParamGather { chunk, bucket, mb, phase } => {
            a.insert("chunk", Int(*chunk as u64));
            a.insert("bucket", Int(*bucket as u64));
            a.insert("microbatch", Int(*mb as u64));
            a.insert("phase", Str(phase.key().to_string()));
            "parameter gather"
        }
        CollPurpose::TiedEmbeddingGrad => "tied embedding gradient",
        CollPurpose::SpReplicatedGrads => "sequence-parallel replicated gradients",
        CollPurpose::GradNorm => "gradient norm",
    };
    a.insert("purpose", Str(purpose.to_string()));
}
