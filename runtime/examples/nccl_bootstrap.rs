//! The NCCL bootstrap over MPI without a GPU (CI's `runtime/ci/mpi-check.sh`):
//!
//! ```text
//! mpirun -np 4 nccl_bootstrap [--corrupt RANK] [--nccl]
//! ```
//!
//! Rank 0 makes a unique id — a stand-in of NCCL's 128 bytes (seeded by the process id),
//! or NCCL's own with `--nccl` (needs libnccl) — and `bootstrap_id` broadcasts its frame
//! over `MPI_COMM_WORLD`; every rank checks it and the ranks' ids are gathered so rank 0
//! can say all of them hold its id. `--corrupt R` flips a bit of the frame on its way to
//! rank R: that rank ends the job (`MPI_Abort`, exit 2) with a message naming itself.

use std::process::ExitCode;

use strata_runtime::cuda::exec::nccl_gpu::{MpiBootstrap, unique_id};
use strata_runtime::cuda::nccl_comm::{Bootstrap, FRAME_BYTES, ID_BYTES, bootstrap_id};

/// MPI's bootstrap, damaging the frame that reaches one rank.
struct Damaged {
    inner: MpiBootstrap,
    rank: Option<u32>,
}

impl Bootstrap for Damaged {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn broadcast(&mut self, buf: &mut [u8; FRAME_BYTES]) -> Result<(), String> {
        self.inner.broadcast(buf)?;
        if self.rank == Some(self.inner.rank()) {
            buf[40] ^= 0x08;
        }
        Ok(())
    }
    fn all_gather(&mut self, v: &[f64]) -> Result<Vec<f64>, String> {
        self.inner.all_gather(v)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let corrupt = match args.iter().position(|a| a == "--corrupt").map(|i| args.get(i + 1).map(|v| v.parse::<u32>())) {
        None => None,
        Some(Some(Ok(r))) => Some(r),
        Some(_) => {
            eprintln!("--corrupt takes a rank (a whole number)");
            return ExitCode::from(2);
        }
    };
    let real = args.iter().any(|a| a == "--nccl");
    let _universe = match strata_runtime::comm::mpi::init() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("starting MPI: {e}");
            return ExitCode::from(2);
        }
    };
    let mut boot = Damaged { inner: MpiBootstrap::world(), rank: corrupt };
    let (rank, size) = (boot.rank(), boot.size());
    let make = || -> Result<[u8; ID_BYTES], String> {
        if real {
            return unique_id();
        }
        let seed = u64::from(std::process::id()) | 1;
        Ok(std::array::from_fn(|i| (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(i as u32 % 64) >> 56) as u8))
    };
    let id = match bootstrap_id(&mut boot, make) {
        Ok(id) => id,
        Err(e) => {
            // The job ends with this rank: its peers would wait in MPI forever.
            eprintln!("{e}");
            boot.inner.abort(2)
        }
    };
    // Every rank's id as f64s of 6 bytes each (below 2^53, so exact).
    let parts: Vec<f64> = id.chunks(6).map(|c| c.iter().fold(0u64, |h, &b| (h << 8) | u64::from(b)) as f64).collect();
    let all = match boot.all_gather(&parts) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rank {rank}: gathering the ids: {e}");
            boot.inner.abort(1)
        }
    };
    if rank == 0 {
        let same = all.chunks(parts.len()).filter(|p| *p == &parts[..]).count();
        if same != size as usize {
            eprintln!("only {same} of {size} ranks hold rank 0's id");
            return ExitCode::from(1);
        }
        println!("{size} of {size} ranks hold rank 0's NCCL id ({} bytes in a {FRAME_BYTES}-byte frame)", ID_BYTES);
    }
    ExitCode::SUCCESS
}
