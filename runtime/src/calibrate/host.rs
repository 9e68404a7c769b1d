//! How this machine's cores are shared, for `strata calibrate` and the measuring commands:
//! the speed of a fixed unit of compute with every core busy ([`speed_probe`]), how many
//! cores' worth of work N busy threads get ([`shared_cores`]), and how much of the machine
//! other processes took meanwhile ([`CpuMeter`]).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use super::{cpu_of, host_cores, median};
use crate::matmul::{MatMut, MatRef, Transpose, matmul};

/// The speed probe's GEMM shape: a unit that fits one core's cache.
const PROBE_SHAPE: (usize, usize, usize) = (256, 256, 256);

/// A fixed unit of compute (GEMMs of an (m, n, k) shape and an element-wise pass over the
/// product, as a transformer's pieces run them): seconds it takes. The shape sets the
/// unit's working set: a job's own shapes make its threads evict each other from the
/// caches as its ranks do. Repeated so that every shape does about the same work.
fn work_unit((m, n, k): (usize, usize, usize)) -> f64 {
    let a: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 * 1e-2).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 89) as f32 * 1e-2).collect();
    let mut c = vec![0.0f32; m * n];
    let reps = (24 * 256usize.pow(3) / (m * n * k).max(1)).max(1);
    let t = Instant::now();
    for _ in 0..reps {
        matmul(MatRef::new(&a, m, k), MatRef::new(&b, k, n), MatMut::new(&mut c, m, n), Transpose::Nn, 1.0, 0.0);
        let mut y = vec![0.0f32; c.len()];
        crate::kernels::gelu_forward(&c, &mut y);
        c.copy_from_slice(&y);
    }
    std::hint::black_box(&c);
    t.elapsed().as_secs_f64()
}

/// Seconds of `threads` threads each running `units` work units of `shape`, started
/// together: (wall time of the last to finish, median per-unit seconds).
fn run_units(threads: u32, units: u32, shape: (usize, usize, usize)) -> (f64, f64) {
    let barrier = Arc::new(Barrier::new(threads as usize));
    let start = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (barrier, start) = (barrier.clone(), start.clone());
            std::thread::spawn(move || {
                work_unit(shape);
                if barrier.wait().is_leader() {
                    *start.lock().expect("start time") = Some(Instant::now());
                }
                let per: Vec<f64> = (0..units).map(|_| work_unit(shape)).collect();
                (Instant::now(), per)
            })
        })
        .collect();
    let results: Vec<(Instant, Vec<f64>)> = handles.into_iter().map(|h| h.join().expect("a work thread")).collect();
    let t0 = start.lock().expect("start time").expect("the leader set it");
    let wall = results.iter().map(|(end, _)| end.duration_since(t0).as_secs_f64()).fold(0.0, f64::max);
    (wall, median(results.into_iter().flat_map(|(_, p)| p).collect()))
}

/// The machine's speed now: seconds of one fixed unit of compute (GEMMs and an element-wise
/// pass) with every core busy, median over a few units. Compare two readings to see whether
/// the host slowed down between them.
pub fn speed_probe() -> f64 {
    run_units(host_cores(), 8, PROBE_SHAPE).1
}

/// Processor sharing's capacity: with `threads` threads computing at once, the cores'
/// worth of work done per second, in units of one thread's speed while every core is busy
/// (one thread per core). c cores with no loss from oversubscription give c; the loss is
/// what time-slicing costs — each slice starts on caches the other threads filled — so the
/// unit is a GEMM of `shape` (m, n, k: a job's own, e.g. its MLP's) and the element-wise pass
/// over its product, whose working set is the job's. (A unit that fits a core's cache four
/// times over hides it: 8 threads on this project's 2-core host kept 1.95 cores' worth with
/// 256³ GEMMs.)
/// Seven trials (with three, the figure moved ±4% between calibrations on the 2-core host),
/// each pairing the two runs back to back; the median ratio, at most the host's cores.
pub fn shared_cores(threads: u32, shape: (usize, usize, usize)) -> f64 {
    let cores = host_cores();
    let units = 8;
    let threads = threads.max(1);
    let trials: Vec<f64> = (0..7)
        .map(|_| {
            // One thread's speed with every core busy: a work unit's median time on `cores`
            // threads; then the wall time of `threads` threads doing `units` each.
            let (_, unit_s) = run_units(cores, units, shape);
            let (wall, _) = run_units(threads, units, shape);
            (threads * units) as f64 * unit_s / wall
        })
        .collect();
    median(trials).min(cores as f64)
}

/// What the executor's copies around a collective cost, CPU ns per byte
/// ([`staging_rates`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StagingRates {
    /// Into one freshly allocated message (a bucket's worth), page faults included.
    pub message: f64,
    /// Into freshly allocated per-unit tensors (ZeRO-3's gathered parameters).
    pub tensors: f64,
    /// Back over tensors the rank holds.
    pub copy: f64,
}

/// The executor's copies around a collective (`strata_models::plan::exec::staging`), as
/// `threads` rank threads make them at once. Each thread holds `bytes` in 8 unit tensors
/// (a bucket spans a few layers) and, five times after a warm-up: builds one freshly
/// allocated message from them and drops it (as a posted message is dropped once its
/// peers have read it); copies a result into 8 freshly allocated tensors and drops them
/// (as a ZeRO-3 gather fills its units); and copies a result back over the held tensors.
/// Thread CPU time (wall time where the platform has none), medians over every repetition
/// of every thread. The fresh copies differ from the copy back by what the allocator does
/// (a message this large is mapped anew, and every page faults in; smaller tensors may
/// reuse freed memory), so each is measured as the executor allocates it.
pub fn staging_rates(threads: u32, bytes: u64) -> StagingRates {
    const UNITS: usize = 8;
    let per = ((bytes / 4) as usize / UNITS).max(1);
    let threads = threads.max(1) as usize;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut held: Vec<Vec<f32>> = (0..UNITS).map(|i| vec![(t * UNITS + i) as f32; per]).collect();
                let result = vec![1.0f32; per * UNITS];
                barrier.wait();
                let mut samples = [Vec::new(), Vec::new(), Vec::new()];
                for rep in 0..6 {
                    let (msg, m) = cpu_of(|| {
                        let mut msg = Vec::with_capacity(per * UNITS);
                        held.iter().for_each(|h| msg.extend_from_slice(h));
                        msg
                    });
                    std::hint::black_box(&msg);
                    drop(msg);
                    let (units, u) = cpu_of(|| result.chunks(per).map(<[f32]>::to_vec).collect::<Vec<_>>());
                    std::hint::black_box(&units);
                    drop(units);
                    let ((), b) = cpu_of(|| {
                        for (h, r) in held.iter_mut().zip(result.chunks(per)) {
                            h.copy_from_slice(r);
                        }
                    });
                    std::hint::black_box(&held);
                    // The first repetition warms the allocator up.
                    if rep > 0 {
                        for (s, x) in samples.iter_mut().zip([m, u, b]) {
                            s.push(x);
                        }
                    }
                }
                samples
            })
        })
        .collect();
    let mut all = [Vec::new(), Vec::new(), Vec::new()];
    for h in handles {
        for (a, s) in all.iter_mut().zip(h.join().expect("a staging thread")) {
            a.extend(s);
        }
    }
    let moved = (per * UNITS * 4) as f64;
    let [m, u, b] = all.map(|v| median(v) * 1e9 / moved);
    StagingRates { message: m, tensors: u, copy: b }
}

/// CPU time of the whole host and of this process (with its waited-for children), to tell
/// how much of the machine other processes took while a measurement ran (Linux `/proc/stat`
/// and `/proc/self/stat`, in clock ticks). On other systems every reading is `None`.
#[derive(Clone, Copy, Debug)]
pub struct CpuMeter {
    host_busy: u64,
    host_total: u64,
    own: u64,
}

impl CpuMeter {
    pub fn now() -> Option<CpuMeter> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
        // user nice system idle iowait irq softirq steal …: idle and iowait are not busy.
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces): utime, stime, and the
        // children's cutime, cstime (a tool that runs strata as a child counts it as its own).
        let rest = own_stat.rsplit_once(')')?.1;
        let f: Vec<u64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
        let own = f.get(11)? + f.get(12)? + f.get(13)? + f.get(14)?;
        Some(CpuMeter { host_busy: total - idle, host_total: total, own })
    }

    /// The share of the machine's CPU time since `self` that other processes used (0 = the
    /// machine was ours; 0.5 = half of every core went elsewhere).
    pub fn foreign_share(&self) -> Option<f64> {
        let now = CpuMeter::now()?;
        let total = now.host_total.saturating_sub(self.host_total);
        if total == 0 {
            return Some(0.0);
        }
        let busy = now.host_busy.saturating_sub(self.host_busy);
        let own = now.own.saturating_sub(self.own);
        Some(busy.saturating_sub(own) as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_copies_cost_some_time_per_byte() {
        let r = staging_rates(2, 1 << 20);
        assert!([r.message, r.tensors, r.copy].iter().all(|x| *x > 0.0 && x.is_finite()), "{r:?}");
    }

    #[test]
    fn the_meter_sees_this_process_as_its_own() {
        let Some(m) = CpuMeter::now() else { return };
        work_unit(PROBE_SHAPE);
        let share = m.foreign_share().unwrap();
        assert!((0.0..=1.0).contains(&share), "{share}");
    }
}
