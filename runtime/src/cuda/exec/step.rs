//! One step of a GPU rank, entry by entry of its schedule: `begin` loads the batches,
//! `enqueue` runs one entry (the stream's event waits, the op, its end event), `finish`
//! reads the losses back and builds the trace. A rank alone runs every entry in order
//! ([`GpuRank::step`]); the multi-rank driver (`multi`) runs the entries itself, holding a
//! rank at a collective or a receive until its peers are there, and enqueues those ops
//! across ranks between `open` and `close`.

use strata_models::plan::{OpId, OpKind, Stream};
use strata_models::trace::{MemSample, Span};

use super::device::Device;
use super::rank::{GpuRank, Res};
use crate::exec::StepReport;

/// A step under way on one rank.
pub struct StepRun<E> {
    step: u32,
    record: bool,
    t0: E,
    samples: Vec<(OpId, u64)>,
}

impl<D: Device> GpuRank<D> {
    /// Runs one step: every op of the program enqueued in the schedule's order.
    pub fn step(&mut self, step: u32) -> Res<StepReport> {
        let mut run = self.begin(step)?;
        for k in 0..self.sched.order.len() {
            self.enqueue(&mut run, k)?;
        }
        self.finish(run)
    }

    /// Entries of this rank's schedule.
    pub(super) fn entries(&self) -> usize {
        self.sched.order.len()
    }

    /// The stream of schedule entry `k` (a free's: none).
    pub(super) fn entry_stream(&self, k: usize) -> Option<Stream> {
        self.sched.order[k].stream
    }

    /// The op of schedule entry `k`.
    pub(super) fn entry_op(&self, k: usize) -> OpId {
        self.sched.order[k].op
    }

    pub(super) fn begin(&mut self, step: u32) -> Res<StepRun<D::Event>> {
        self.adamw.lr = self.lr_at(step);
        self.grad_norm = None;
        self.nonfinite = None;
        self.clip_scale = 1.0;
        self.load_batches(step)?;
        let record = self.cfg.trace_step == Some(step);
        let t0 = self.gpu.event(true)?;
        if record {
            self.gpu.sync_all()?;
            self.gpu.record(&t0, Stream::Compute)?;
        }
        Ok(StepRun { step, record, t0, samples: Vec::new() })
    }

    /// Starts entry `k` on its stream: the op becomes current, its stream waits on the
    /// events of its cross-stream dependencies, and the traced step records its start.
    /// `None` for a free (which runs on no stream and is done here).
    pub(super) fn open(&mut self, run: &StepRun<D::Event>, k: usize) -> Res<Option<Stream>> {
        let sched = self.sched.clone();
        let e = &sched.order[k];
        let Some(s) = e.stream else {
            let OpKind::Free { buf } = self.plan.program(self.rank).ops[e.op as usize].kind else {
                unreachable!("only frees run on no stream")
            };
            self.measure();
            self.free(buf, e.waits.clone())?;
            return Ok(None);
        };
        self.cur = (e.op, s);
        for &w in &e.waits {
            self.gpu.wait(s, &self.ends[w as usize])?;
        }
        if run.record {
            self.gpu.record(&self.starts[e.op as usize], s)?;
        }
        Ok(Some(s))
    }

    /// Ends entry `k`: its end event, and the memory sample after it.
    pub(super) fn close(&mut self, run: &mut StepRun<D::Event>, k: usize) -> Res<()> {
        let (op, s) = self.cur;
        debug_assert_eq!(op, self.sched.order[k].op);
        self.gpu.record(&self.ends[op as usize], s)?;
        if matches!(self.plan.program(self.rank).ops[op as usize].kind, OpKind::Alloc(_)) {
            self.measure();
        }
        let in_use = self.pool.stats().in_use;
        if run.samples.last().is_none_or(|l| l.1 != in_use) {
            run.samples.push((op, in_use));
        }
        Ok(())
    }

    /// Runs entry `k` on this rank alone.
    pub(super) fn enqueue(&mut self, run: &mut StepRun<D::Event>, k: usize) -> Res<()> {
        if let Some(s) = self.open(run, k)? {
            self.run(self.cur.0, s)?;
            self.close(run, k)?;
        }
        Ok(())
    }

    /// Waits for the step's work, reads the losses back, checks the buffers and builds the
    /// traced step's spans and memory samples.
    pub(super) fn finish(&mut self, run: StepRun<D::Event>) -> Res<StepReport> {
        self.gpu.sync_all()?;
        let loss_sum = self.step_losses()?;
        self.end_of_step()?;
        let (mut spans, mut memory) = (Vec::new(), Vec::new());
        if run.record {
            let ns = |e: &D::Event| -> Res<u64> {
                let ms = self.gpu.elapsed_ms(&run.t0, e)?;
                Ok((f64::from(ms.max(0.0)) * 1e6) as u64)
            };
            for e in &self.sched.order {
                if let Some(s) = e.stream {
                    let (a, b) = (ns(&self.starts[e.op as usize])?, ns(&self.ends[e.op as usize])?);
                    spans.push(Span { rank: self.rank, stream: s, op: e.op, start_ns: a, end_ns: b.max(a) });
                }
            }
            for (op, bytes) in &run.samples {
                let t_ns = ns(&self.ends[*op as usize])?;
                memory.push(MemSample { rank: self.rank, t_ns, bytes: bytes + self.context_bytes });
            }
        }
        self.measure();
        Ok(StepReport {
            step: run.step,
            loss_sum: Some(loss_sum),
            grad_norm: self.grad_norm,
            nonfinite_grad: self.nonfinite.take(),
            spans,
            memory,
            cpu: None,
        })
    }
}
