//! Pipeline sends and receives in the order a framework's pipeline issues them.
//!
//! Megatron-LM and torchtitan post a pass's send as soon as it has run and receive ahead
//! on the pipeline stream, so transfers overlap compute. DeepSpeed's `PipelineEngine`
//! ([`crate::framework::Framework::sends_block_compute`]) executes its `TrainSchedule`'s
//! instructions one after another on the compute stream: each `SendActivation` /
//! `SendGrad` / `RecvActivation` / `RecvGrad` is a blocking `dist.broadcast` on the two
//! stages' group (`runtime/pipe/p2p.py`), and a pass's send is issued in the *next* step's
//! instruction slot (`runtime/pipe/schedule.py`): a forward step runs `SendGrad(prev)`,
//! `RecvActivation`, `ForwardPass`; a backward step `RecvGrad`, `SendActivation(prev)`,
//! `BackwardPass`. So a receive waits for the compute before it and for the transfer
//! before it, a send for the receive before it, and the next compute for both: no
//! pipeline transfer overlaps compute or another transfer of the stage.

use crate::plan::ir::*;
use crate::plan::lower::StageLowering;

impl<'p, 'a> StageLowering<'p, 'a> {
    fn serial_p2p(&self) -> bool {
        self.s().training.framework.sends_block_compute(self.s())
    }

    /// Emits a pass's send of `buf` (allocated after the pass's last compute): now, or
    /// under DeepSpeed in the next instruction slot.
    pub(super) fn send(&mut self, after: OpId, p2p: P2pOp, buf: BufId) {
        if self.serial_p2p() {
            self.flush_send();
            self.deferred_send = Some((p2p, buf));
            return;
        }
        let send = self.e.op(Stream::Pp, &[after], &[buf], OpKind::Send(p2p));
        self.e.free(Stream::Pp, &[send], buf);
    }

    /// A receive into `buf`; returns its op.
    pub(super) fn recv(&mut self, p2p: P2pOp, buf: BufId) -> OpId {
        let mut deps = Vec::new();
        if self.serial_p2p() {
            deps.extend(self.last_compute);
            deps.extend(self.last_p2p);
        }
        let op = self.e.op(Stream::Pp, &deps, &[buf], OpKind::Recv(p2p));
        if self.serial_p2p() {
            self.last_p2p = Some(op);
        }
        op
    }

    /// Issues the deferred send, if any (DeepSpeed): after the compute and the transfer
    /// before it; the next compute waits for its delivery.
    pub(super) fn flush_send(&mut self) {
        let Some((p2p, buf)) = self.deferred_send.take() else { return };
        let deps: Vec<OpId> = self.last_compute.into_iter().chain(self.last_p2p).collect();
        let send = self.e.op(Stream::Pp, &deps, &[buf], OpKind::Send(p2p));
        self.e.free(Stream::Pp, &[send], buf);
        self.pending_sync.push(send);
        self.last_p2p = Some(send);
    }
}
