//! A rank's program as readable text: one op a line, with its stream, microbatch, chunk,
//! bytes and cross-stream waits — what `strata plan --rank R` prints and what the golden
//! snapshot tests compare.
//!
//! ```text
//! #   12 compute  attn fwd           L1 mb0 c0  2.1 GFLOP
//! #   13 tp       all-reduce tp      attn fwd L1 mb0 c0  1.0 MiB  after #12
//! ```

use std::fmt::Write;

use crate::plan::ir::*;
use crate::plan::lowered::Plan;

/// Bytes in binary units (`1.5 MiB`).
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[i]) }
}

fn flops(f: u64) -> String {
    let v = f as f64;
    if v >= 1e12 {
        format!("{:.2} TFLOP", v / 1e12)
    } else if v >= 1e9 {
        format!("{:.2} GFLOP", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} MFLOP", v / 1e6)
    } else {
        format!("{:.1} KFLOP", v / 1e3)
    }
}

fn purpose(p: &CollPurpose) -> String {
    match p {
        CollPurpose::Tp { site, piece, phase, mb, chunk, layer } => {
            let site = match site {
                TpSite::Reduce => "reduce",
                TpSite::Gather => "gather",
                TpSite::GatherSaved => "gather-saved",
                TpSite::LossStats => "loss-stats",
            };
            let l = if piece.in_layer() { format!(" L{layer}") } else { String::new() };
            format!("{site} {} {}{l} mb{mb} c{chunk}", piece.key(), phase.key())
        }
        CollPurpose::GradBucket { chunk, bucket, mb } => format!("grads c{chunk} b{bucket} mb{mb}"),
        CollPurpose::ParamBucket { chunk, bucket } => format!("params c{chunk} b{bucket}"),
        CollPurpose::ParamGather { chunk, bucket, mb, phase } => {
            format!("gather params c{chunk} b{bucket} mb{mb} {}", phase.key())
        }
        CollPurpose::TiedEmbeddingGrad => "tied embedding grads".to_string(),
        CollPurpose::SpReplicatedGrads => "replicated grads (sequence parallel)".to_string(),
        CollPurpose::GradNorm => "grad norm".to_string(),
        CollPurpose::Moe { dispatch, phase, mb, chunk, layer } => {
            format!("{} L{layer} mb{mb} c{chunk} {}", if *dispatch { "dispatch" } else { "combine" }, phase.key())
        }
        CollPurpose::Cp { phase, mb, chunk, layer, step } => {
            format!("context L{layer} mb{mb} c{chunk} {} step{step}", phase.key())
        }
        CollPurpose::ExpertGradBucket { chunk, bucket, mb } => format!("expert grads c{chunk} b{bucket} mb{mb}"),
    }
}

/// One op as a line (without the index).
pub fn op_line(plan: &Plan, op: &Op) -> String {
    let body = match &op.kind {
        OpKind::Compute(c) => {
            let what = format!("{} {}", c.piece.key(), c.phase.key());
            let l = if c.piece.in_layer() { format!("L{} ", c.layer) } else { String::new() };
            let cost = plan.cost(c.cost);
            let work = if cost.flops > 0 { flops(cost.flops) } else { bytes(cost.mem_bytes) };
            format!("{what:<18} {l}mb{} c{}  {work}", c.mb, c.chunk)
        }
        OpKind::Collective(c) => {
            format!("{:<18} {}  {}", format!("{} {}", c.kind.key(), c.group.key()), purpose(&c.purpose), bytes(c.bytes))
        }
        OpKind::Send(p) | OpKind::Recv(p) => {
            let dir = if matches!(op.kind, OpKind::Send(_)) { "send" } else { "recv" };
            let peer = match p.peer {
                Peer::Next => "next",
                Peer::Prev => "prev",
            };
            let kind = match p.kind {
                P2pKind::Activation => "act",
                P2pKind::Gradient => "grad",
            };
            format!("{:<18} mb{} vs{}  {}", format!("{dir} {peer} {kind}"), p.mb, p.vstage, bytes(p.bytes))
        }
        OpKind::Alloc(a) => {
            format!("{:<18} b{} {}  {}", format!("alloc {}", a.class.key()), a.buf, a.name, bytes(a.bytes))
        }
        OpKind::Free { buf } => format!("{:<18} b{buf}", "free"),
    };
    let mut line = format!("{:<8} {body}", op.stream.key());
    if !op.deps.is_empty() {
        let deps: Vec<String> = op.deps.iter().map(|d| format!("#{d}")).collect();
        write!(line, "  after {}", deps.join(",")).expect("write to String");
    }
    line
}

/// The program of `rank`, one op a line.
pub fn program_text(plan: &Plan, rank: u32) -> String {
    let program = plan.program(rank);
    let coord = plan.grid.coord(rank);
    let mut out = format!(
        "# {} (tp {}, dp {}, pp {}): {} ops\n",
        plan.grid.label(rank),
        coord.tp,
        coord.dp,
        coord.pp,
        program.ops.len()
    );
    for (i, op) in program.ops.iter().enumerate() {
        writeln!(out, "#{i:>5} {}", op_line(plan, op)).expect("write to String");
    }
    out
}
