//! The [`Bootstrap`] of one process driving every GPU of its node: its ranks are threads
//! ([`ThreadBootstrap::node`] hands one handle to each), and what MPI carries between
//! processes goes through shared memory instead — rank 0's NCCL id frame to the others and
//! the step's small all-gather, both one primitive, a meeting: every rank leaves its bytes
//! in its slot of the current round, the last to arrive closes the round, and all read the
//! round's slots in rank order. Rounds follow each other on the same slots, so it is
//! reusable every step, and it is a barrier (no rank leaves a round before all arrived).
//!
//! Nothing waits forever: a wait longer than the handle's timeout is an error naming the
//! ranks that did not arrive; a rank that fails says so ([`Halt::leave`]) and every wait
//! of its peers — in the bootstrap, or in an NCCL wrapper polling [`Halt::left`] — ends at
//! once with an error naming it, the first rank that left being the one the job reports.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::nccl_comm::{Bootstrap, FRAME_BYTES};

struct State {
    /// The round being collected (rounds before it are closed).
    round: u64,
    slots: Vec<Option<Vec<u8>>>,
    /// The last closed round and its slots, for the ranks that have not read them yet (a
    /// round cannot close while a rank still has to read the one before: it must arrive).
    closed: Option<(u64, Arc<Vec<Vec<u8>>>)>,
    /// The first rank that failed.
    left: Option<u32>,
}

struct Shared {
    size: u32,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked holding the lock left the state consistent (every update is
        // one assignment under it); its peers learn of it through `left`.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The job's failure flag, shared by the ranks of one node: which rank failed first.
#[derive(Clone)]
pub struct Halt(Arc<Shared>);

impl Halt {
    /// Rank `rank` failed: every peer's wait ends naming it (the first rank to leave stays
    /// the one named).
    pub fn leave(&self, rank: u32) {
        let mut st = self.0.lock();
        st.left.get_or_insert(rank);
        drop(st);
        self.0.changed.notify_all();
    }

    /// The first rank that failed, if any has.
    pub fn left(&self) -> Option<u32> {
        self.0.lock().left
    }
}

/// One thread's handle on its node's bootstrap: its rank, the job's size, its own count of
/// rounds, and how long it waits for its peers at each.
pub struct ThreadBootstrap {
    rank: u32,
    shared: Arc<Shared>,
    round: u64,
    timeout: Duration,
}

impl ThreadBootstrap {
    /// The handles of a job of `size` ranks, rank `i` at index `i`; each waits at most
    /// `timeout` for its peers.
    pub fn node(size: u32, timeout: Duration) -> Vec<ThreadBootstrap> {
        let state = State { round: 0, slots: vec![None; size as usize], closed: None, left: None };
        let shared = Arc::new(Shared { size, state: Mutex::new(state), changed: Condvar::new() });
        (0..size).map(|rank| ThreadBootstrap { rank, shared: shared.clone(), round: 0, timeout }).collect()
    }

    /// The job's failure flag.
    pub fn halt(&self) -> Halt {
        Halt(self.shared.clone())
    }

    /// This rank's `mine` and every peer's for the next round, in rank order, once all
    /// arrived; an error naming the missing ranks after the timeout, or the rank that left.
    fn meet(&mut self, what: &str, mine: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>, String> {
        let (me, round) = (self.rank, self.round);
        let deadline = Instant::now() + self.timeout;
        let mut mine = Some(mine);
        let mut st = self.shared.lock();
        loop {
            if st.round > round {
                let (closed, slots) = st.closed.clone().ok_or("a closed round without its slots")?;
                if closed != round {
                    return Err(format!("rank {me}: {what}: round {round} was overtaken by round {closed}"));
                }
                self.round += 1;
                return Ok(slots);
            }
            if let Some(r) = st.left {
                return Err(format!("rank {me}: {what}: rank {r} failed (its error says why)"));
            }
            if let Some(m) = mine.take() {
                st.slots[me as usize] = Some(m);
            }
            if st.slots.iter().all(Option::is_some) {
                let slots: Vec<Vec<u8>> = st.slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
                st.closed = Some((round, Arc::new(slots)));
                st.round += 1;
                self.shared.changed.notify_all();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> =
                    st.slots.iter().enumerate().filter(|s| s.1.is_none()).map(|s| s.0.to_string()).collect();
                return Err(format!(
                    "rank {me}: {what}: rank{} {} did not arrive within {} s (died or hangs)",
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", "),
                    self.timeout.as_secs_f64()
                ));
            }
            st = self.shared.changed.wait_timeout(st, deadline - now).map_or_else(|p| p.into_inner().0, |g| g.0);
        }
    }
}

impl Bootstrap for ThreadBootstrap {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn size(&self) -> u32 {
        self.shared.size
    }
    fn broadcast(&mut self, buf: &mut [u8; FRAME_BYTES]) -> Result<(), String> {
        let mine = if self.rank == 0 { buf.to_vec() } else { Vec::new() };
        let all = self.meet("the broadcast from rank 0", mine)?;
        buf.copy_from_slice(all[0].get(..FRAME_BYTES).ok_or("rank 0 broadcast a short frame")?);
        Ok(())
    }
    fn all_gather(&mut self, v: &[f64]) -> Result<Vec<f64>, String> {
        let all = self.meet("the all-gather", v.iter().flat_map(|x| x.to_le_bytes()).collect())?;
        if let Some(r) = all.iter().position(|s| s.len() != 8 * v.len()) {
            return Err(format!(
                "rank {}: the all-gather: rank {r} gave {} values, this rank {}",
                self.rank,
                all[r].len() / 8,
                v.len()
            ));
        }
        Ok(all.iter().flat_map(|s| s.chunks_exact(8)).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::nccl_comm::{ID_BYTES, bootstrap_id};

    const LONG: Duration = Duration::from_secs(20);

    /// Runs `f` on every rank of a `size`-rank node, each on its own thread.
    fn on_threads<T: Send + 'static>(
        size: u32,
        timeout: Duration,
        f: impl Fn(&mut ThreadBootstrap) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = ThreadBootstrap::node(size, timeout)
            .into_iter()
            .map(|mut b| {
                let f = f.clone();
                std::thread::spawn(move || f(&mut b))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("no panic")).collect()
    }

    #[test]
    fn the_nccl_id_reaches_every_thread_and_gathers_come_back_in_rank_order_every_round() {
        let got = on_threads(4, LONG, |b| {
            let r = b.rank();
            let id = bootstrap_id(b, || Ok(std::array::from_fn::<u8, ID_BYTES, _>(|i| (i * 5 + 1) as u8)))?;
            // Rounds reuse the slots: each gives values of its own round, ranks arriving
            // in any order (the odd ones late).
            let mut rounds = Vec::new();
            for step in 0..5u32 {
                if r % 2 == 1 {
                    std::thread::yield_now();
                }
                rounds.push(b.all_gather(&[f64::from(r), f64::from(step * 10 + r)])?);
            }
            Ok::<_, String>((id, rounds))
        });
        for (r, g) in got.into_iter().enumerate() {
            let (id, rounds) = g.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert_eq!(id[..3], [1, 6, 11], "rank {r}: rank 0's id");
            for (step, v) in rounds.iter().enumerate() {
                let want: Vec<f64> = (0..4).flat_map(|q| [q as f64, (step * 10 + q) as f64]).collect();
                assert_eq!(v, &want, "rank {r} round {step}");
            }
        }
    }

    #[test]
    fn a_rank_that_never_arrives_is_named_after_the_timeout_not_waited_for_forever() {
        // Long enough for all three to meet at the first round on a loaded machine.
        let got = on_threads(3, Duration::from_secs(2), |b| {
            // Rank 2 gathers once, then never again (it hangs elsewhere).
            let first = b.all_gather(&[1.0]);
            if b.rank() == 2 {
                return first.map(|_| Vec::new());
            }
            first?;
            b.all_gather(&[2.0])
        });
        assert_eq!(got[2], Ok(Vec::new()));
        for r in [0, 1] {
            let e = got[r].clone().expect_err("rank 2 never came");
            assert!(e.starts_with(&format!("rank {r}: the all-gather: rank 2 did not arrive within 2 s")), "{e}");
        }
        // Two missing, at the broadcast.
        let got = on_threads(3, Duration::from_millis(100), |b| {
            if b.rank() == 0 { b.broadcast(&mut [0; FRAME_BYTES]) } else { Ok(()) }
        });
        let e = got[0].clone().unwrap_err();
        assert!(e.contains("the broadcast from rank 0: ranks 1, 2 did not arrive"), "{e}");
    }

    #[test]
    fn a_rank_that_leaves_ends_its_peers_waits_naming_it() {
        let got = on_threads(4, LONG, |b| {
            b.all_gather(&[0.0])?;
            if b.rank() == 1 {
                b.halt().leave(1);
                // A later failure does not replace the first.
                b.halt().leave(3);
                return Err("rank 1 failed its step".to_string());
            }
            b.all_gather(&[1.0]).map(|_| ())
        });
        assert_eq!(got[1], Err("rank 1 failed its step".into()));
        for r in [0, 2, 3] {
            let e = got[r].clone().unwrap_err();
            assert_eq!(e, format!("rank {r}: the all-gather: rank 1 failed (its error says why)"));
        }
    }

    #[test]
    fn gathers_of_different_lengths_are_refused_naming_the_rank() {
        let got = on_threads(2, LONG, |b| b.all_gather(&vec![0.5; 1 + b.rank() as usize]));
        assert!(got[0].clone().unwrap_err().contains("rank 1 gave 2 values, this rank 1"), "{:?}", got[0]);
    }
}
