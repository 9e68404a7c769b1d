//! A fake NCCL that moves data between the threads of one process (tests only), each
//! rank on its own computing host stand-in wrapped in a [`LinkedDevice`] that gives it
//! NCCL's stream semantics: a call is queued on its plan stream and returns at once; it
//! runs when it reaches the head of its stream's queue — a collective leaves the rank's
//! input on the [`Wire`] and completes once every member of its group instance made its
//! k-th call on that communicator (the sum or gather in member order), a send posts to the
//! peer's mailbox, a receive completes when the message is there. A kernel, copy or
//! read-back on a stream first waits for that stream's queue (CUDA's stream order), and an
//! event waited on carries the recording stream's queue position across, so the host
//! blocks only where the GPU would make that stream wait — a blocking fake would deadlock
//! where NCCL does not (the last stage's tied-table all-reduce queued before its last
//! gradient send, which stage 0 needs before its own all-reduce).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::LaunchConfig;
use strata_models::plan::{OpId, Plan, Stream};

use crate::cuda::CudaError;
use crate::cuda::exec::device::{Arg, Device, Dt, Op, Ptr};
use crate::cuda::exec::host::{HostDevice, HostMemory, Ty};
use crate::cuda::exec::nccl::{Call, CommKey, Nccl, NcclDt};
use crate::cuda::nccl_comm::NcclFailure;
use crate::cuda::node_boot::Halt;

/// How long a rank waits for its peers: far above a step's time here, so that only a
/// deadlock or a missing peer reaches it.
pub const WAIT: Duration = Duration::from_secs(60);

type Key = (CommKey, u32, u64);
/// Every member's input (in member order) and how many members took the result.
type Inputs = (Vec<Option<Vec<f64>>>, usize);

#[derive(Default)]
struct WireState {
    /// Each collective under way: every member's input, and how many took the result.
    meetings: BTreeMap<Key, Inputs>,
    mail: BTreeMap<(u32, u32), VecDeque<Vec<f64>>>,
}

/// What the ranks' fake NCCLs share: the collectives under way, the messages in flight.
pub struct Wire {
    plan: Arc<Plan>,
    state: Mutex<WireState>,
    changed: Condvar,
    /// A mutation: a collective returns this rank's own data, as if it summed nothing.
    drop_sums: bool,
}

impl Wire {
    pub fn new(plan: Arc<Plan>, drop_sums: bool) -> Arc<Wire> {
        Arc::new(Wire { plan, state: Mutex::default(), changed: Condvar::new(), drop_sums })
    }
}

enum Item {
    Call {
        call: Call,
        key: Option<Key>,
        deposited: bool,
    },
    /// Until stream `.0` has run `.1` items.
    After(usize, u64),
}

#[derive(Default)]
struct Queues {
    q: [VecDeque<Item>; 4],
    queued: [u64; 4],
    ran: [u64; 4],
    seq: BTreeMap<CommKey, u64>,
}

/// A rank's host stand-in with NCCL's stream semantics (see the module's comment).
pub struct LinkedDevice {
    pub inner: HostDevice,
    wire: Arc<Wire>,
    rank: u32,
    halt: Halt,
    queues: RefCell<Queues>,
}

fn read(gpu: &HostDevice, p: Ptr, n: usize, dt: NcclDt) -> Result<Vec<f64>, String> {
    let st = gpu.state.borrow();
    Ok(match dt {
        NcclDt::F32 => st.rd(Ty::F32, p, n)?.into_iter().map(f64::from).collect(),
        NcclDt::Bf16 => st.rd(Ty::Bf16, p, n)?.into_iter().map(f64::from).collect(),
        NcclDt::F64 => st.f64s(p, n)?,
    })
}

fn write(gpu: &HostDevice, p: Ptr, x: &[f64], dt: NcclDt) -> Result<(), String> {
    let mut st = gpu.state.borrow_mut();
    match dt {
        NcclDt::F32 => st.wr(Ty::F32, p, &x.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        NcclDt::Bf16 => st.wr(Ty::Bf16, p, &x.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        NcclDt::F64 => st.wr_f64(p, x),
    }
}

/// Σ of the members' slices in member order: fp32 sums for fp32 and bf16 (rounded to
/// bf16 when written), f64 for f64.
fn sum(parts: &[&[f64]], dt: NcclDt) -> Vec<f64> {
    (0..parts[0].len())
        .map(|i| match dt {
            NcclDt::F64 => parts.iter().map(|p| p[i]).sum(),
            _ => f64::from(parts.iter().fold(0f32, |a, p| a + p[i] as f32)),
        })
        .collect()
}

fn cuda(what: &str) -> impl FnOnce(String) -> CudaError + '_ {
    move |cause| CudaError { what: what.into(), cause }
}

impl LinkedDevice {
    pub fn new(inner: HostDevice, wire: Arc<Wire>, rank: u32, halt: Halt) -> LinkedDevice {
        LinkedDevice { inner, wire, rank, halt, queues: RefCell::default() }
    }

    fn members(&self, comm: CommKey) -> Vec<u32> {
        match comm {
            CommKey::Group(kind) => self.wire.plan.grid.group(self.rank, kind),
            CommKey::P2p => vec![self.rank],
        }
    }

    /// Queues `call` on stream `s` (its place on its communicator taken now, in call
    /// order, as NCCL matches calls), then runs what can run.
    fn enqueue(&self, s: Stream, call: Call) -> Result<(), String> {
        let mut q = self.queues.borrow_mut();
        let key = match call.comm() {
            Some(comm @ CommKey::Group(_)) => {
                let seq = q.seq.entry(comm).or_default();
                *seq += 1;
                Some((comm, self.members(comm)[0], *seq))
            }
            _ => None,
        };
        q.q[s.index()].push_back(Item::Call { call, key, deposited: false });
        q.queued[s.index()] += 1;
        drop(q);
        self.progress()
    }

    /// Runs the head of every stream's queue while one can run; never waits.
    fn progress(&self) -> Result<(), String> {
        loop {
            let mut any = false;
            for s in 0..4 {
                while self.step(s)? {
                    any = true;
                }
            }
            if !any {
                return Ok(());
            }
        }
    }

    /// Runs (or advances) the head of stream `s`'s queue; whether anything changed.
    fn step(&self, s: usize) -> Result<bool, String> {
        let mut q = self.queues.borrow_mut();
        let Some(head) = q.q[s].front_mut() else { return Ok(false) };
        let done = match head {
            Item::After(j, n) => {
                let (j, n) = (*j, *n);
                q.ran[j] >= n
            }
            Item::Call { call, key, deposited } => {
                let (call, key) = (*call, *key);
                let first = !*deposited;
                *deposited = true;
                match self.run(call, key, first)? {
                    true => true,
                    false => return Ok(first),
                }
            }
        };
        if done {
            q.q[s].pop_front();
            q.ran[s] += 1;
        }
        Ok(done)
    }

    /// One call at the head of its stream: whether it completed (`first`: its input is
    /// left on the wire now).
    fn run(&self, call: Call, key: Option<Key>, first: bool) -> Result<bool, String> {
        let me = self.rank;
        let g = &self.inner;
        let mut st = self.wire.state.lock().map_err(|_| "the wire's lock")?;
        let input = |st: &mut WireState, v: Vec<f64>, n: usize| {
            let key = key.expect("a collective");
            let m = st.meetings.entry(key).or_insert_with(|| (vec![None; n], 0));
            let pos = self.members(key.0).iter().position(|&r| r == me).expect("a member");
            m.0[pos] = Some(v);
        };
        if first {
            match call {
                Call::AllReduce { comm, buf: p, count, dt }
                | Call::Reduce { comm, buf: p, count, dt, .. }
                | Call::Broadcast { comm, buf: p, count, dt, .. }
                | Call::AllGather { comm, src: p, count, dt, .. } => {
                    let n = self.members(comm).len();
                    input(&mut st, read(g, p, count, dt)?, n);
                }
                Call::ReduceScatter { comm, src, count, dt, .. } => {
                    let n = self.members(comm).len();
                    input(&mut st, read(g, src, count * n, dt)?, n);
                }
                Call::Send { buf, count, dt, peer, .. } => {
                    let v = read(g, buf, count, dt)?;
                    st.mail.entry((me, peer)).or_default().push_back(v);
                    self.wire.changed.notify_all();
                    return Ok(true);
                }
                Call::Recv { .. } | Call::GroupStart | Call::GroupEnd => {}
            }
            self.wire.changed.notify_all();
        }
        if let Call::Recv { buf, count, dt, peer, .. } = call {
            let Some(v) = st.mail.get_mut(&(peer, me)).and_then(VecDeque::pop_front) else { return Ok(false) };
            if v.len() != count {
                return Err(format!("rank {me}: a receive of {count} elements from rank {peer}, {} sent", v.len()));
            }
            write(g, buf, &v, dt)?;
            return Ok(true);
        }
        let Some(key) = key else { return Ok(true) };
        let members = self.members(key.0);
        let pos = members.iter().position(|&r| r == me).expect("a member");
        let m = st.meetings.get_mut(&key).ok_or("a meeting that ended before this rank read it")?;
        if m.0.iter().any(Option::is_none) {
            return Ok(false);
        }
        let mut all: Vec<Vec<f64>> = m.0.iter().map(|s| s.clone().unwrap_or_default()).collect();
        m.1 += 1;
        if m.1 == members.len() {
            st.meetings.remove(&key);
        }
        drop(st);
        if self.wire.drop_sums {
            all = vec![all[pos].clone(); members.len()];
        }
        let parts: Vec<&[f64]> = all.iter().map(Vec::as_slice).collect();
        match call {
            Call::AllReduce { buf, dt, .. } => write(g, buf, &sum(&parts, dt), dt)?,
            Call::Reduce { buf, dt, root, .. } if pos == root as usize => write(g, buf, &sum(&parts, dt), dt)?,
            Call::Broadcast { buf, dt, root, .. } if pos != root as usize => write(g, buf, &all[root as usize], dt)?,
            Call::AllGather { dst, dt, .. } => write(g, dst, &all.concat(), dt)?,
            Call::ReduceScatter { dst, count, dt, .. } => {
                let mine: Vec<&[f64]> = parts.iter().map(|a| &a[pos * count..(pos + 1) * count]).collect();
                write(g, dst, &sum(&mine, dt), dt)?;
            }
            _ => {}
        }
        Ok(true)
    }

    /// Waits until stream `s`'s queue (every stream's: `None`) has run, running what can.
    fn drain(&self, s: Option<Stream>) -> Result<(), CudaError> {
        let t0 = Instant::now();
        let what = format!("rank {}: waiting for {s:?}'s NCCL work", self.rank);
        loop {
            self.progress().map_err(cuda(&what))?;
            let q = self.queues.borrow();
            if s.map_or(q.q.iter().all(VecDeque::is_empty), |s| q.q[s.index()].is_empty()) {
                return Ok(());
            }
            drop(q);
            if let Some(r) = self.halt.left().filter(|&r| r != self.rank) {
                return Err(cuda(&what)(format!("rank {r} failed")));
            }
            if t0.elapsed() > WAIT {
                return Err(cuda(&what)(format!("its peers did not answer within {} s", WAIT.as_secs())));
            }
            let st = self.wire.state.lock().map_err(|_| cuda(&what)("the wire's lock".into()))?;
            let _ = self.wire.changed.wait_timeout(st, Duration::from_millis(5));
        }
    }
}

impl Device for LinkedDevice {
    type Event = Cell<(usize, u64)>;
    type Mem = HostMemory;

    fn memory(&self) -> HostMemory {
        self.inner.memory()
    }
    fn name(&self) -> &str {
        "host stand-in, linked"
    }
    fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }
    fn free_bytes(&self) -> Result<u64, CudaError> {
        self.inner.free_bytes()
    }
    fn launch(&self, s: Stream, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        self.drain(Some(s))?;
        self.inner.launch(s, name, cfg, args)
    }
    fn gemm(&self, m: usize, nn: usize, k: usize, a: Op, b: Op, c: Ptr, c_dt: Dt, beta: f32) -> Result<(), CudaError> {
        self.drain(Some(Stream::Compute))?;
        self.inner.gemm(m, nn, k, a, b, c, c_dt, beta)
    }
    fn copy(&self, s: Stream, dst: Ptr, src: Ptr, bytes: usize) -> Result<(), CudaError> {
        self.drain(Some(s))?;
        self.inner.copy(s, dst, src, bytes)
    }
    fn zero(&self, s: Stream, dst: Ptr, bytes: usize) -> Result<(), CudaError> {
        self.drain(Some(s))?;
        self.inner.zero(s, dst, bytes)
    }
    fn upload<T: Copy>(&self, dst: Ptr, src: &[T]) -> Result<(), CudaError> {
        self.inner.upload(dst, src)
    }
    fn download<T: Copy>(&self, s: Stream, dst: &mut [T], src: Ptr) -> Result<(), CudaError> {
        self.drain(Some(s))?;
        self.inner.download(s, dst, src)
    }
    fn event(&self, _timing: bool) -> Result<Self::Event, CudaError> {
        Ok(Cell::new((0, 0)))
    }
    fn record(&self, e: &Self::Event, s: Stream) -> Result<(), CudaError> {
        e.set((s.index(), self.queues.borrow().queued[s.index()]));
        Ok(())
    }
    fn wait(&self, s: Stream, e: &Self::Event) -> Result<(), CudaError> {
        let (j, n) = e.get();
        let mut q = self.queues.borrow_mut();
        if q.ran[j] < n && j != s.index() {
            q.q[s.index()].push_back(Item::After(j, n));
            q.queued[s.index()] += 1;
        }
        Ok(())
    }
    fn elapsed_ms(&self, _from: &Self::Event, _to: &Self::Event) -> Result<f32, CudaError> {
        Ok(0.0)
    }
    fn sync_all(&self) -> Result<(), CudaError> {
        self.drain(None)
    }
    fn idle(&self) -> Result<bool, CudaError> {
        self.progress().map_err(cuda("polling the NCCL queues"))?;
        Ok(self.queues.borrow().q.iter().all(VecDeque::is_empty))
    }
}

/// A rank's fake NCCL on its [`LinkedDevice`]: the calls of an NCCL group queued at its
/// end, its sends first (NCCL runs a group's sends and receives together); optionally
/// failing its n-th call.
#[derive(Default)]
pub struct Linked {
    pub fail_at: Option<usize>,
    rank: u32,
    calls: usize,
    group: Option<Vec<(Stream, Call)>>,
}

impl Linked {
    pub fn new(rank: u32, fail_at: Option<usize>) -> Linked {
        Linked { fail_at, rank, ..Linked::default() }
    }
}

impl Nccl<LinkedDevice> for Linked {
    fn call(&mut self, gpu: &LinkedDevice, s: Stream, op: OpId, call: Call) -> Result<(), NcclFailure> {
        self.calls += 1;
        let rank = self.rank;
        let fail = |what: String, code| NcclFailure::Error { rank, what, code };
        if self.fail_at == Some(self.calls) {
            return Err(fail(format!("op #{op} ({call:?})"), 5));
        }
        match call {
            Call::GroupStart => {
                self.group.get_or_insert_with(Vec::new);
            }
            Call::GroupEnd => {
                let mut calls = self.group.take().ok_or_else(|| fail("a group end without a start".into(), 5))?;
                calls.sort_by_key(|c| !matches!(c.1, Call::Send { .. }));
                for (s, c) in calls {
                    gpu.enqueue(s, c).map_err(|e| fail(e, 4))?;
                }
            }
            c => match self.group.as_mut() {
                Some(g) => g.push((s, c)),
                None => gpu.enqueue(s, c).map_err(|e| fail(e, 4))?,
            },
        }
        Ok(())
    }
    fn async_error(&mut self) -> u32 {
        0
    }
    fn abort(&mut self) {}
}
