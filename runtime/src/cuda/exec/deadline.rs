//! A deadline on a blocking call that cannot be cancelled. `ncclCommInitRank` returns only
//! once every rank of the job has joined: a peer that died before it, or never started,
//! leaves the others blocked in it for ever, where no NCCL error and no step timeout can
//! reach them. [`run_with_deadline`] runs the call on this thread while a watchdog thread
//! waits for it; past the deadline the watchdog runs `on_expiry` — for the executor, a
//! message naming the rank and `std::process::exit(1)` (a failed run; under mpirun the
//! launcher then ends the other processes) — so the job ends rather than hangs.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Runs `f` here; if it has not returned within `timeout`, the watchdog runs `on_expiry`
/// (on its own thread, while `f` is still blocked). Returns `f`'s result when it returns.
pub fn run_with_deadline<T>(timeout: Duration, on_expiry: impl FnOnce() + Send + 'static, f: impl FnOnce() -> T) -> T {
    let state = Arc::new((Mutex::new(false), Condvar::new()));
    let watchdog = {
        let state = state.clone();
        std::thread::spawn(move || {
            let (done, wake) = &*state;
            let guard = done.lock().unwrap_or_else(PoisonError::into_inner);
            let (guard, _) = wake.wait_timeout_while(guard, timeout, |d| !*d).unwrap_or_else(PoisonError::into_inner);
            if !*guard {
                drop(guard);
                on_expiry();
            }
        })
    };
    let out = f();
    let (done, wake) = &*state;
    *done.lock().unwrap_or_else(PoisonError::into_inner) = true;
    wake.notify_all();
    // The watchdog ends at once now (or has run `on_expiry` already).
    let _ = watchdog.join();
    out
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_call_that_returns_in_time_never_fires_the_watchdog() {
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        let v = run_with_deadline(Duration::from_secs(30), move || tx.send(()).unwrap(), || 7);
        assert_eq!(v, 7);
        assert!(rx.try_recv().is_err(), "the watchdog fired");
        assert!(t0.elapsed() < Duration::from_secs(5), "the watchdog held the caller: {:?}", t0.elapsed());
    }

    #[test]
    fn a_call_past_its_deadline_fires_the_watchdog_while_it_is_still_blocked() {
        // The call waits for the watchdog's signal: it can only return because the watchdog
        // fired while the call was blocked, as a hung ncclCommInitRank would be.
        let (tx, rx) = mpsc::channel::<()>();
        let t0 = Instant::now();
        let v = run_with_deadline(
            Duration::from_millis(50),
            move || tx.send(()).unwrap(),
            || rx.recv_timeout(Duration::from_secs(30)).map(|_| "woken by the watchdog"),
        );
        assert_eq!(v, Ok("woken by the watchdog"));
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}
