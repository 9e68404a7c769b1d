//! The CPU time of the calling thread (POSIX `CLOCK_THREAD_CPUTIME_ID`): what a piece of
//! work really cost a rank's thread, whatever else shared its core meanwhile. 64-bit Linux
//! only; elsewhere every reading is `None` and callers fall back to wall time. The one
//! `unsafe` FFI call of the crate besides the GEMM lives here.

/// CPU time this thread has run so far, ns.
pub fn thread_ns() -> Option<u64> {
    imp::thread_ns()
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod imp {
    /// `struct timespec` of 64-bit Linux.
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }

    /// Linux's `CLOCK_THREAD_CPUTIME_ID`.
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

    pub fn thread_ns() -> Option<u64> {
        let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime (libc, which std links) writes one timespec through the valid,
        // exclusive pointer it is given and has no other effect.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (rc == 0 && ts.tv_sec >= 0 && ts.tv_nsec >= 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod imp {
    pub fn thread_ns() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_time_counts_work_not_sleep() {
        let Some(t0) = super::thread_ns() else { return };
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let t1 = super::thread_ns().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let t2 = super::thread_ns().unwrap();
        assert!(t1 > t0, "work costs CPU time");
        assert!(t2 - t1 < 10_000_000, "sleeping costs (almost) none: {} ns", t2 - t1);
    }
}
