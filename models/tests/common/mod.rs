//! What the plan test suites share: the peak of a program's Alloc/Free timeline.
#![allow(dead_code)] // each test crate uses the helpers it needs

use strata_models::plan::{BufId, OpKind, Program};

/// Peak bytes of a program's Alloc/Free timeline taken in program order.
pub fn program_order_peak(p: &Program) -> u64 {
    let mut live: std::collections::BTreeMap<BufId, u64> = Default::default();
    let (mut now, mut peak) = (0u64, 0u64);
    for op in &p.ops {
        match &op.kind {
            OpKind::Alloc(a) => {
                live.insert(a.buf, a.bytes);
                now += a.bytes;
                peak = peak.max(now);
            }
            OpKind::Free { buf } => now -= live.remove(buf).unwrap(),
            _ => {}
        }
    }
    peak
}
