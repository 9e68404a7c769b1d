//! What a one-process-per-GPU NCCL communicator needs before any GPU is involved, tested
//! here: the frame that carries NCCL's unique id from rank 0 to the others (over MPI's
//! broadcast, or any byte transport), the groups of a plan as NCCL communicator splits
//! (color and key per rank), NCCL's result codes as failures naming the rank, and the
//! watchdog that turns an asynchronous NCCL error or a silent peer into an error naming
//! the rank instead of a hang (`ncclCommGetAsyncError` polled until the op is done or the
//! timeout passes).
//!
//! The bootstrap is [`bootstrap_id`] over any [`Bootstrap`] transport (MPI's, with the
//! `mpi` feature: `exec::nccl_gpu::MpiBootstrap`; the threads of one process driving a
//! node's GPUs: `node_boot::ThreadBootstrap`; a fake in the tests), and each process
//! picks its GPU from the launcher's local rank ([`local_rank`]). The communicators built
//! from these and the calls on them are `exec::nccl` (the driver) and `exec::nccl_gpu`
//! (cudarc's NCCL).

use std::time::{Duration, Instant};

use strata_models::plan::{GroupKind, Plan};

/// Bytes of NCCL's unique id (`ncclUniqueId::internal`).
pub const ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"STNC";
const VERSION: u16 = 1;
/// magic, version, world size, the id, FNV-1a of everything before it.
pub const FRAME_BYTES: usize = 4 + 2 + 4 + ID_BYTES + 8;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Rank 0's frame of the unique id for a job of `world` ranks.
pub fn encode_id(id: &[u8; ID_BYTES], world: u32) -> [u8; FRAME_BYTES] {
    let mut f = [0u8; FRAME_BYTES];
    f[..4].copy_from_slice(MAGIC);
    f[4..6].copy_from_slice(&VERSION.to_le_bytes());
    f[6..10].copy_from_slice(&world.to_le_bytes());
    f[10..10 + ID_BYTES].copy_from_slice(id);
    let sum = fnv1a(&f[..10 + ID_BYTES]);
    f[10 + ID_BYTES..].copy_from_slice(&sum.to_le_bytes());
    f
}

/// The id from a received frame, checked: its framing, its checksum, and that rank 0's job
/// has as many ranks as this one's (a rank of another launch would hang in NCCL's init).
pub fn decode_id(frame: &[u8], world: u32, rank: u32) -> Result<[u8; ID_BYTES], String> {
    if frame.len() != FRAME_BYTES {
        return Err(format!("rank {rank}: the NCCL id frame has {} bytes, not {FRAME_BYTES}", frame.len()));
    }
    if &frame[..4] != MAGIC {
        return Err(format!("rank {rank}: the NCCL id frame does not start with {MAGIC:?} (not Strata's broadcast)"));
    }
    let version = u16::from_le_bytes([frame[4], frame[5]]);
    if version != VERSION {
        return Err(format!("rank {rank}: NCCL id frame version {version}, this build reads {VERSION}"));
    }
    let sum = u64::from_le_bytes(frame[10 + ID_BYTES..].try_into().map_err(|_| "frame length checked".to_string())?);
    if sum != fnv1a(&frame[..10 + ID_BYTES]) {
        return Err(format!("rank {rank}: the NCCL id frame is corrupt (checksum mismatch)"));
    }
    let sent = u32::from_le_bytes([frame[6], frame[7], frame[8], frame[9]]);
    if sent != world {
        return Err(format!("rank {rank}: rank 0 started a job of {sent} ranks, this one has {world}"));
    }
    let mut id = [0u8; ID_BYTES];
    id.copy_from_slice(&frame[10..10 + ID_BYTES]);
    Ok(id)
}

/// One rank's place in the NCCL communicator of a plan group: `ncclCommSplit`'s color
/// (the group instance: its lowest world rank) and key (its position in the group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub color: u32,
    pub key: u32,
    pub size: u32,
}

/// The split of `rank` for its group of `kind` in `plan` (the same grid the CPU
/// communicator and the shared-GPU communicator group by).
pub fn split(plan: &Plan, rank: u32, kind: GroupKind) -> Split {
    let members = plan.grid.group(rank, kind);
    let color = members.iter().copied().min().unwrap_or(rank);
    let key = members.iter().position(|&r| r == rank).unwrap_or(0) as u32;
    Split { color, key, size: members.len() as u32 }
}

/// What an NCCL result code means, for the message that ends the job.
pub fn explain(code: u32) -> &'static str {
    match code {
        0 => "success",
        1 => "a CUDA call inside NCCL failed (ncclUnhandledCudaError)",
        2 => "a system call failed: a socket, shared memory or the network (ncclSystemError)",
        3 => "an internal NCCL error (ncclInternalError)",
        4 => "an invalid argument: a buffer, count or type (ncclInvalidArgument)",
        5 => "invalid usage: mismatched collectives or communicators (ncclInvalidUsage)",
        6 => "a remote peer failed or went away (ncclRemoteError)",
        7 => "still in progress (ncclInProgress)",
        _ => "an unknown NCCL result code",
    }
}

/// Why a rank's NCCL work stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NcclFailure {
    #[error("rank {rank}: NCCL failed during {what}: {} (code {code})", explain(*code))]
    Error { rank: u32, what: String, code: u32 },
    #[error("rank {rank}: {what} did not finish within {secs} s (a peer died or hangs)", secs = .after.as_secs_f64())]
    Timeout { rank: u32, what: String, after: Duration },
}

/// Waits for an enqueued NCCL op: polls `done` (the op's event) and `async_error` (the
/// communicator's `ncclCommGetAsyncError`: 0 while healthy, 7 while in progress) every
/// `every`, until done, an error, or `timeout` — never longer. The caller aborts the
/// communicator on an error (`ncclCommAbort`) so the peers' NCCL calls return too.
pub fn watch(
    rank: u32,
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: impl FnMut() -> bool,
    mut async_error: impl FnMut() -> u32,
) -> Result<(), NcclFailure> {
    let t0 = Instant::now();
    loop {
        let code = async_error();
        if code != 0 && code != 7 {
            return Err(NcclFailure::Error { rank, what: what.to_string(), code });
        }
        if done() {
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            return Err(NcclFailure::Timeout { rank, what: what.to_string(), after: t0.elapsed() });
        }
        std::thread::sleep(every);
    }
}

/// What the processes of a job share before NCCL exists: who they are, rank 0's bytes
/// broadcast to all, and a small all-gather (the step's losses).
pub trait Bootstrap {
    fn rank(&self) -> u32;
    fn size(&self) -> u32;
    /// Rank 0's `buf` into every rank's.
    fn broadcast(&mut self, buf: &mut [u8; FRAME_BYTES]) -> Result<(), String>;
    /// Every rank's `v` (all of the same length), in rank order.
    fn all_gather(&mut self, v: &[f64]) -> Result<Vec<f64>, String>;
}

/// NCCL's unique id on every rank: rank 0 makes it (`make_id`, `ncclGetUniqueId`) and
/// broadcasts its frame; every rank checks the frame it got (a corrupt one, or one from a
/// job of another size, is an error naming the rank — NCCL's init would hang on it).
pub fn bootstrap_id(
    t: &mut dyn Bootstrap,
    make_id: impl FnOnce() -> Result<[u8; ID_BYTES], String>,
) -> Result<[u8; ID_BYTES], String> {
    let (rank, world) = (t.rank(), t.size());
    let mut frame = [0u8; FRAME_BYTES];
    if rank == 0 {
        frame = encode_id(&make_id().map_err(|e| format!("rank 0: making NCCL's unique id: {e}"))?, world);
    }
    t.broadcast(&mut frame).map_err(|e| format!("rank {rank}: broadcasting NCCL's unique id: {e}"))?;
    decode_id(&frame, world, rank)
}

/// The launcher's rank of this process on its node (which GPU it drives): Open MPI's,
/// MPICH's, Slurm's or torchrun's variable, the first set; `None` if none is.
pub fn local_rank(env: impl Fn(&str) -> Option<String>) -> Result<Option<u32>, String> {
    for var in ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"] {
        if let Some(v) = env(var) {
            return v.trim().parse().map(Some).map_err(|_| {
                format!("{var}={v:?} is not a local rank (a whole number); the launcher sets it, unset it to use the job rank")
            });
        }
    }
    Ok(None)
}

/// The GPU a process drives: its local rank (else its job rank) on a node of `gpus`.
pub fn pick_gpu(rank: u32, local: Option<u32>, gpus: usize) -> Result<usize, String> {
    let l = local.unwrap_or(rank) as usize;
    if l < gpus {
        Ok(l)
    } else {
        Err(format!(
            "rank {rank}: local rank {l} but this node has {gpus} GPU(s); launch at most {gpus} processes per node \
             (mpirun -n N --map-by ppr:{gpus}:node)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use strata_models::Scenario;

    /// A job's processes in one: rank 0's broadcast lands in a shared slot that the
    /// others read; `flip` damages the frame on its way to one rank.
    struct Fake {
        rank: u32,
        size: u32,
        slot: Rc<RefCell<Option<[u8; FRAME_BYTES]>>>,
        flip: Option<(u32, usize)>,
    }

    impl Bootstrap for Fake {
        fn rank(&self) -> u32 {
            self.rank
        }
        fn size(&self) -> u32 {
            self.size
        }
        fn broadcast(&mut self, buf: &mut [u8; FRAME_BYTES]) -> Result<(), String> {
            if self.rank == 0 {
                *self.slot.borrow_mut() = Some(*buf);
            } else {
                *buf = self.slot.borrow().ok_or("rank 0 has not broadcast")?;
                if let Some((r, at)) = self.flip
                    && r == self.rank
                {
                    buf[at] ^= 0x40;
                }
            }
            Ok(())
        }
        fn all_gather(&mut self, _: &[f64]) -> Result<Vec<f64>, String> {
            Err("not used".into())
        }
    }

    #[test]
    fn the_id_reaches_every_rank_and_a_corrupt_frame_is_refused_naming_the_rank() {
        let slot = Rc::new(RefCell::new(None));
        let mut made = 0;
        let mut ids = Vec::new();
        for rank in 0..4 {
            let mut t = Fake { rank, size: 4, slot: slot.clone(), flip: Some((2, 77)) };
            ids.push(bootstrap_id(&mut t, || {
                made += 1;
                Ok(id())
            }));
        }
        assert_eq!(made, 1, "only rank 0 makes the id");
        assert_eq!((&ids[0], &ids[1], &ids[3]), (&Ok(id()), &Ok(id()), &Ok(id())));
        assert_eq!(ids[2], Err("rank 2: the NCCL id frame is corrupt (checksum mismatch)".to_string()));
        // A rank of a launch of another size.
        let mut t = Fake { rank: 1, size: 8, slot, flip: None };
        assert!(
            bootstrap_id(&mut t, || Ok(id())).unwrap_err().contains("rank 0 started a job of 4 ranks, this one has 8")
        );
        // Rank 0 cannot make an id (no NCCL): its error says so.
        let mut t = Fake { rank: 0, size: 2, slot: Rc::new(RefCell::new(None)), flip: None };
        assert_eq!(
            bootstrap_id(&mut t, || Err("no libnccl.so".into())),
            Err("rank 0: making NCCL's unique id: no libnccl.so".into())
        );
    }

    #[test]
    fn the_local_rank_comes_from_the_launcher_and_picks_the_gpu() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(local_rank(env(&[("SLURM_LOCALID", "3"), ("LOCAL_RANK", "1")])), Ok(Some(3)));
        assert_eq!(local_rank(env(&[("OMPI_COMM_WORLD_LOCAL_RANK", "2"), ("SLURM_LOCALID", "0")])), Ok(Some(2)));
        assert_eq!(local_rank(env(&[])), Ok(None));
        assert!(
            local_rank(env(&[("LOCAL_RANK", "x")])).unwrap_err().starts_with("LOCAL_RANK=\"x\" is not a local rank")
        );
        assert_eq!(pick_gpu(9, Some(1), 8), Ok(1));
        assert_eq!(pick_gpu(3, None, 8), Ok(3));
        assert!(pick_gpu(9, Some(8), 8).unwrap_err().starts_with("rank 9: local rank 8 but this node has 8 GPU(s)"));
    }

    fn id() -> [u8; ID_BYTES] {
        std::array::from_fn(|i| (i * 7 + 3) as u8)
    }

    #[test]
    fn the_id_frame_round_trips_and_refuses_corruption_and_other_jobs() {
        let f = encode_id(&id(), 8);
        assert_eq!(decode_id(&f, 8, 3), Ok(id()));
        let mut bad = f;
        bad[50] ^= 1;
        assert!(decode_id(&bad, 8, 3).unwrap_err().contains("rank 3: the NCCL id frame is corrupt"));
        assert!(decode_id(&f, 4, 1).unwrap_err().contains("rank 0 started a job of 8 ranks, this one has 4"));
        assert!(decode_id(&f[..20], 8, 2).unwrap_err().contains("has 20 bytes"));
        let mut other = f;
        other[..4].copy_from_slice(b"XXXX");
        assert!(decode_id(&other, 8, 2).unwrap_err().contains("not Strata's broadcast"));
    }

    #[test]
    fn every_group_instance_is_one_split_with_keys_in_group_order() {
        let text = include_str!("../../../scenarios/tiny-gpt-cpu.toml");
        let p = strata_models::plan::lower(&Scenario::from_toml(text, "t", "t", &[]).unwrap()).unwrap();
        for kind in [GroupKind::Tp, GroupKind::Dp, GroupKind::World, GroupKind::Embedding] {
            let mut by_color: std::collections::BTreeMap<u32, Vec<(u32, u32)>> = Default::default();
            for r in 0..p.grid.ranks() {
                let s = split(&p, r, kind);
                assert_eq!(s.size as usize, p.grid.group(r, kind).len());
                by_color.entry(s.color).or_default().push((s.key, r));
            }
            for (color, mut members) in by_color {
                members.sort_unstable();
                let keys: Vec<u32> = members.iter().map(|m| m.0).collect();
                assert_eq!(keys, (0..keys.len() as u32).collect::<Vec<_>>(), "{kind:?} color {color}");
                let ranks: Vec<u32> = members.iter().map(|m| m.1).collect();
                assert_eq!(ranks, p.grid.group(ranks[0], kind), "{kind:?}: one split is one group");
            }
        }
    }

    #[test]
    fn an_async_error_or_a_silent_peer_ends_the_wait_naming_the_rank() {
        let ms = Duration::from_millis;
        // Done after three polls, healthy (or in progress) meanwhile.
        let mut n = 0;
        assert_eq!(
            watch(
                2,
                "an all-reduce",
                ms(500),
                ms(1),
                || {
                    n += 1;
                    n > 3
                },
                || 7
            ),
            Ok(())
        );
        // A peer died: NCCL reports ncclRemoteError asynchronously.
        let e = watch(5, "the dp all-reduce of bucket 0", ms(500), ms(1), || false, || 6).unwrap_err();
        assert!(
            e.to_string().starts_with("rank 5: NCCL failed during the dp all-reduce of bucket 0: a remote peer"),
            "{e}"
        );
        // Nothing ever completes and NCCL says nothing: the timeout, not a hang.
        let t0 = Instant::now();
        let e = watch(1, "a receive", ms(30), ms(5), || false, || 0).unwrap_err();
        assert!(matches!(e, NcclFailure::Timeout { rank: 1, .. }), "{e}");
        assert!(t0.elapsed() < ms(500), "the watchdog returned in bounded time");
        assert!(explain(2).contains("ncclSystemError") && explain(99).contains("unknown"));
    }
}
