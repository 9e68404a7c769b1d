//! A GPU rank's side of communication: what it contributes to the gradient norm, which
//! tensor a pipeline send ships, and a received message handed to the piece that consumes
//! it — the CPU executor's rules (`exec::coll`, `exec::engine`), on device buffers. The
//! moves between ranks are the multi-rank driver's (`multi`).

use cudarc::driver::LaunchConfig;
use strata_models::plan::{P2pKind, P2pOp, Stream};

use super::device::{Arg, Device, Ptr};
use super::pieces::{C, W};
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use crate::exec::pool::BufKey;

impl<D: Device> GpuRank<D> {
    /// Σ g² over the gradients this rank counts toward the global norm, computed on stream
    /// `s` and read back (the CPU executor's rule): the owned part of its gradients (all of
    /// them under ZeRO-0) except the head's tied copy of the word table (the table's own
    /// copy counts) and, off tensor-parallel rank 0, the replicated tensors; under ZeRO-0
    /// nothing on data-parallel replicas other than the first (their gradients are the
    /// first's after the all-reduce).
    pub(super) fn grad_sq_local(&mut self, s: Stream) -> Res<f64> {
        if self.plan.scenario.zero_stage() == 0 && self.dp.0 != 0 {
            return Ok(0.0);
        }
        const PARTS: usize = 120;
        let tp0 = self.plan.grid.coord(self.rank).tp == 0;
        let partial = self.take("the gradient norm's partial sums", 8 * PARTS as u64)?;
        let total = self.take("the gradient norm", 8)?;
        let mut sum = 0.0f64;
        // ZeRO-2/3 hold the owned gradients only, in the masters' order.
        let sharded = self.plan.scenario.zero_stage() >= 2;
        for c in 0..self.bufs.len() {
            let Some(g) = self.bufs[c].grads.as_ref().map(Tensor::ptr) else { continue };
            // The owned runs but the tied copy, merged where contiguous, in offset order.
            let mut owned: Vec<(usize, usize)> = self.chunks[c]
                .owned_runs()
                .into_iter()
                .filter(|r| !r.tied_copy && (tp0 || !r.replicated))
                .map(|r| if sharded { (r.master, r.master + r.len) } else { (r.flat, r.flat + r.len) })
                .collect();
            owned.sort_unstable();
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for (a, b) in owned {
                match runs.last_mut() {
                    Some(r) if r.1 == a => r.1 = b,
                    _ => runs.push((a, b)),
                }
            }
            for (a, b) in runs {
                let cfg = LaunchConfig { grid_dim: (PARTS as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let args = [Arg::P(g + 4 * a as u64), Arg::L((b - a) as i64), Arg::P(partial.ptr())];
                self.gpu.launch(s, "sum_squares_partial", cfg, &args)?;
                let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let args = [Arg::P(partial.ptr()), Arg::I(PARTS as i32), Arg::P(total.ptr())];
                self.gpu.launch(s, "sum_partials", one, &args)?;
                let mut host = [0f64];
                self.gpu.download(s, &mut host, total.ptr())?;
                sum += host[0];
            }
        }
        self.give(partial);
        self.give(total);
        Ok(sum)
    }

    /// The global norm from Σ g² over every rank, and the clipping factor it implies.
    pub(super) fn set_grad_norm(&mut self, sum: f64) {
        self.grad_norm = Some(sum.sqrt());
        self.clip_scale = crate::optim::clip_scale(sum, self.clip);
    }

    /// The block of the live pipeline-message buffer (`send`: this rank's outgoing one).
    pub(super) fn msg_ptr(&self, send: bool, kind: P2pKind, vstage: u32, mb: u32) -> Res<Ptr> {
        self.plan_buf(BufKey::Msg { send, kind, vstage, mb })
    }

    /// Bytes of one pipeline message: a (T, h) bf16 tensor — the rank's sequence shard,
    /// (T / tp, h), under sequence parallelism (the plan's `residual_bytes`).
    pub(super) fn msg_bytes(&self) -> usize {
        2 * self.dims.rows * self.dims.h
    }

    /// The tensor a send ships: an activation for virtual stage v leaves v − 1 (the residual
    /// after that chunk's last layer), a gradient leaves v itself (the residual gradient
    /// after its first layer's backward).
    pub(super) fn outgoing(&mut self, p: &P2pOp) -> Res<Tensor> {
        let pipe = self.plan.pipeline();
        let (chunk, w) = match p.kind {
            P2pKind::Activation => (pipe.chunk_and_stage(p.vstage - 1).0, W::R),
            P2pKind::Gradient => (pipe.chunk_and_stage(p.vstage).0, W::Dr),
        };
        self.got_here(chunk, p.mb, w)
    }

    /// A received message as tensor `w` of (chunk, mb), copied out of its buffer into a
    /// block of the workspace: the residual entering the chunk (an activation received for
    /// its virtual stage) or the residual gradient leaving it (a gradient received from the
    /// next virtual stage). `None` if no such message is live.
    pub(super) fn incoming(&mut self, chunk: u32, mb: u32, w: W) -> Res<Option<Tensor>> {
        let (pp, stage) = (self.plan.grid.pp, self.plan.grid.coord(self.rank).pp);
        let v = chunk * pp + stage;
        let (kind, vstage) = match w {
            W::R => (P2pKind::Activation, v),
            W::Dr => (P2pKind::Gradient, v + 1),
            _ => return Ok(None),
        };
        let Ok(src) = self.msg_ptr(false, kind, vstage, mb) else { return Ok(None) };
        let bytes = self.msg_bytes();
        let t = self.ws("a received pipeline message", bytes)?;
        self.gpu.copy(C, t.ptr(), src, bytes)?;
        Ok(Some(t))
    }

    /// Tensor `w` of (chunk, mb) from this rank's own pieces only.
    pub(super) fn got_here(&mut self, chunk: u32, mb: u32, w: W) -> Res<Tensor> {
        self.flight.remove(&(chunk, mb, w)).ok_or_else(|| {
            GpuExecError::Unsupported(format!("{w:?} of chunk {chunk} mb {mb} is needed but no earlier op produced it"))
        })
    }
}
