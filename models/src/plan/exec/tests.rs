//! The execution semantics on small hand-written programs.

use super::*;
use crate::plan::ir::{AllocOp, BufClass, Op, OpKind, P2pKind, P2pOp, Peer, Program, Stream};

fn op(stream: Stream, deps: &[u32], kind: OpKind) -> Op {
    Op { stream, deps: deps.to_vec(), bufs: vec![], kind }
}

fn alloc(buf: u32) -> OpKind {
    OpKind::Alloc(AllocOp { buf, class: BufClass::Workspace, bytes: 8, name: format!("b{buf}") })
}

fn send() -> OpKind {
    OpKind::Send(P2pOp { peer: Peer::Next, kind: P2pKind::Activation, mb: 0, vstage: 1, bytes: 8 })
}

/// Starts everything that may start on every stream; returns the ops started, in order.
fn drain(c: &mut Cursor, g: &ProgramGraph) -> Vec<Next> {
    let mut out = vec![];
    for s in Stream::ALL {
        loop {
            match c.next(g, s) {
                Next::Blocked | Next::End => break,
                n => out.push(n),
            }
        }
    }
    out
}

#[test]
fn a_send_does_not_hold_its_stream_but_a_gating_op_does() {
    // pp: send, alloc, alloc — the first alloc may start while the send is in flight, the
    // second waits for the first.
    let p = Program {
        ops: vec![op(Stream::Pp, &[], send()), op(Stream::Pp, &[], alloc(0)), op(Stream::Pp, &[], alloc(1))],
    };
    let g = ProgramGraph::new(&p).unwrap();
    let mut c = Cursor::new(&g);
    assert_eq!(drain(&mut c, &g), vec![Next::Start(0), Next::Start(1)]);
    let mut wakes = vec![];
    c.complete(&g, 1, |w| wakes.push(w));
    assert_eq!(wakes, vec![Wake::Stream(Stream::Pp)]);
    assert_eq!(drain(&mut c, &g), vec![Next::Start(2)]);
    assert_eq!(c.remaining(), 2, "only what the backend finished is done");
}

#[test]
fn a_free_is_posted_at_once_and_takes_effect_with_its_deps() {
    // compute: alloc b0 (0); dp: a long op (1) after 0; compute: free b0 after 1 (2), alloc (3).
    let p = Program {
        ops: vec![
            op(Stream::Compute, &[], alloc(0)),
            op(Stream::Dp, &[0], alloc(5)),
            op(Stream::Compute, &[1], OpKind::Free { buf: 0 }),
            op(Stream::Compute, &[], alloc(1)),
        ],
    };
    let g = ProgramGraph::new(&p).unwrap();
    let mut c = Cursor::new(&g);
    // The free is posted once the op before it has started, although its dep has not run;
    // the alloc behind it waits for the gate (op 0), not for the free.
    assert_eq!(drain(&mut c, &g), vec![Next::Start(0), Next::Free { op: 2, ready: false }]);
    let mut wakes = vec![];
    c.complete(&g, 0, |w| wakes.push(w));
    assert_eq!(wakes, vec![Wake::Stream(Stream::Dp), Wake::Stream(Stream::Compute)]);
    assert_eq!(drain(&mut c, &g), vec![Next::Start(3), Next::Start(1)]);
    let mut wakes = vec![];
    c.complete(&g, 1, |w| wakes.push(w));
    assert_eq!(wakes, vec![Wake::Free(2), Wake::Stream(Stream::Dp)]);
}

#[test]
fn deps_must_point_backwards() {
    let p = Program { ops: vec![op(Stream::Compute, &[0], alloc(0))] };
    let e = ProgramGraph::new(&p).unwrap_err();
    assert_eq!(e.op, 0);
    assert!(e.reason.contains("not earlier"), "{e}");
}

#[test]
fn turns_cycle_in_the_executors_order() {
    let mut t = Turn::Compute;
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(t);
        t = t.next();
    }
    assert_eq!(seen, [Turn::Compute, Turn::Post, Turn::Finish, Turn::Compute]);
}
