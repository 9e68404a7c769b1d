//! The device caching pool: every `Alloc`/`Free` of the plan is an allocation from one pool
//! per GPU rank, so the measured peak (the pool's high-water mark plus the context) and the
//! plan's predicted bytes come from the same buffers, as on CPU (`exec::pool`).
//!
//! Sizes are rounded as PyTorch's CUDA caching allocator rounds them
//! (`c10/cuda/CUDACachingAllocator.cpp`): a block takes its request rounded up to
//! `kMinBlockSize` = 512 B (`round_size`, what `memory_allocated` counts: the pool's
//! `in_use`); what a block reserves from the device is its size up to `kSmallSize` = 1 MiB,
//! and above that a multiple of `kRoundLarge` = 2 MiB (`get_allocation_size` rounds large
//! segments so; this pool does not split segments, so each large block reserves its own
//! rounded segment: `reserved`, what `memory_reserved` counts). A freed block goes back to
//! its class's free list and the next request of that class reuses it. Growth is bounded:
//! the bytes reserved from the device never exceed the limit (the device's memory less the
//! context). A request that would cross it first releases every cached free block
//! (PyTorch's `release_cached_blocks` on an allocation failure) and, if it still does not
//! fit, is an error naming the buffer.
//!
//! Every block is held under an *account* (a plan buffer's name, or the name of what the
//! executor holds beside the plan, `overhead`), and the pool keeps the blocks in use per
//! account at its high-water mark ([`DevicePool::at_peak`]), so every byte of the measured
//! peak has a name.
//!
//! A freed block carries a *fence* — on the GPU, the CUDA events of the ops the `Free`
//! waited for — which the next user of the block must wait on before touching it, since
//! the host hands a block out again as soon as the free is enqueued, not when the GPU has
//! finished with it. The pool is generic over the memory it draws from ([`DeviceMemory`]),
//! so its accounting is tested on the host.

use std::collections::BTreeMap;

/// Blocks up to this size reserve their own size (PyTorch's `kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Rounding of every request (PyTorch's `kMinBlockSize`).
pub const SMALL_STEP: u64 = 512;
/// Rounding of what a larger block reserves (PyTorch's `kRoundLarge`).
pub const LARGE_STEP: u64 = 2 << 20;

/// The block size a request of `bytes` takes (a zero-byte request takes the smallest):
/// PyTorch's `round_size`.
pub fn size_class(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(SMALL_STEP).saturating_mul(SMALL_STEP)
}

/// The bytes a block of class `class` reserves from the device.
pub fn reserve_size(class: u64) -> u64 {
    if class <= SMALL_SIZE { class } else { class.div_ceil(LARGE_STEP).saturating_mul(LARGE_STEP) }
}

/// Where the pool's blocks come from: the device (cudarc), or host bookkeeping in tests.
pub trait DeviceMemory {
    type Block;
    /// Reserves `bytes` of device memory.
    fn reserve(&mut self, bytes: u64) -> Result<Self::Block, String>;
    /// Gives a block back to the device (dropping it does, for cudarc's slices).
    fn release(&mut self, block: Self::Block) {
        drop(block);
    }
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "out of GPU memory allocating {buffer} ({bytes} B, block of {class} B): {in_use} B in use by the plan's \
         live buffers, the limit is {limit} B (the device's memory less the CUDA context)"
    )]
    OutOfMemory { buffer: String, bytes: u64, class: u64, in_use: u64, limit: u64 },
    #[error("the device refused {class} B for {buffer}: {cause}")]
    Device { buffer: String, class: u64, cause: String },
}

/// A block handed out: its class, the device block, and the fence of its previous user
/// (`None` for a fresh block).
#[derive(Debug)]
pub struct Lease<B, F> {
    pub class: u64,
    /// The bytes asked for, and the account the block is held under.
    pub requested: u64,
    pub account: String,
    pub block: B,
    pub fence: Option<F>,
}

/// What the pool has done, for the measured memory and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of blocks handed out now.
    pub in_use: u64,
    /// Bytes reserved from the device now (in use + cached free blocks).
    pub reserved: u64,
    /// The high-water mark of `in_use`.
    pub peak_in_use: u64,
    /// The high-water mark of `reserved`: what the device had to give.
    pub peak_reserved: u64,
    /// Requests served from a cached block.
    pub reuses: u64,
    /// Requests that reserved a fresh block.
    pub reserves: u64,
    /// Times the cache was released to fit a request.
    pub cache_flushes: u64,
}

/// The blocks of one account in use: how many, the bytes asked for, their classes' bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub blocks: u64,
    pub requested: u64,
    pub class: u64,
}

/// Blocks in use by account.
pub type ByAccount = BTreeMap<String, Held>;

/// Cached blocks of one class, each with the fence of its last user.
type FreeList<B, F> = Vec<(B, Option<F>)>;

/// A caching pool over `M`, with fences of type `F`.
pub struct DevicePool<M: DeviceMemory, F> {
    mem: M,
    limit: u64,
    free: BTreeMap<u64, FreeList<M::Block, F>>,
    stats: PoolStats,
    /// Blocks in use now, and when `in_use` first reached its high-water mark, by account.
    in_use_by: ByAccount,
    at_peak: ByAccount,
}

impl<M: DeviceMemory, F> DevicePool<M, F> {
    /// A pool that never reserves more than `limit` bytes.
    pub fn new(mem: M, limit: u64) -> Self {
        DevicePool {
            mem,
            limit,
            free: BTreeMap::new(),
            stats: PoolStats::default(),
            in_use_by: ByAccount::new(),
            at_peak: ByAccount::new(),
        }
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A block of at least `bytes` for the buffer named `buffer` (named in errors), held
    /// under the account of the same name.
    pub fn alloc(&mut self, buffer: &str, bytes: u64) -> Result<Lease<M::Block, F>, PoolError> {
        self.alloc_as(buffer, buffer, bytes)
    }

    /// A block of at least `bytes` for `buffer`, held under `account`.
    pub fn alloc_as(&mut self, account: &str, buffer: &str, bytes: u64) -> Result<Lease<M::Block, F>, PoolError> {
        let class = size_class(bytes);
        let lease = |block, fence| Lease { class, requested: bytes, account: account.to_string(), block, fence };
        if let Some((block, fence)) = self.free.get_mut(&class).and_then(|v| v.pop()) {
            self.stats.reuses += 1;
            self.take(account, bytes, class);
            return Ok(lease(block, fence));
        }
        let seg = reserve_size(class);
        if self.stats.reserved.saturating_add(seg) > self.limit && self.cached_bytes() > 0 {
            self.flush();
        }
        if self.stats.reserved.saturating_add(seg) > self.limit {
            return Err(PoolError::OutOfMemory {
                buffer: buffer.to_string(),
                bytes,
                class,
                in_use: self.stats.in_use,
                limit: self.limit,
            });
        }
        let block =
            self.mem.reserve(seg).map_err(|cause| PoolError::Device { buffer: buffer.to_string(), class, cause })?;
        self.stats.reserves += 1;
        self.stats.reserved += seg;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.take(account, bytes, class);
        Ok(lease(block, None))
    }

    fn take(&mut self, account: &str, requested: u64, class: u64) {
        self.stats.in_use += class;
        let h = self.in_use_by.entry(account.to_string()).or_default();
        h.blocks += 1;
        h.requested += requested;
        h.class += class;
        if self.stats.in_use > self.stats.peak_in_use {
            self.stats.peak_in_use = self.stats.in_use;
            self.at_peak.clone_from(&self.in_use_by);
        }
    }

    /// The blocks in use when `in_use` first reached its high-water mark, by account: their
    /// classes' bytes sum to `peak_in_use`.
    pub fn at_peak(&self) -> &ByAccount {
        &self.at_peak
    }

    /// Returns a block; its next user waits on `fence` first.
    pub fn free(&mut self, lease: Lease<M::Block, F>, fence: Option<F>) {
        debug_assert!(self.stats.in_use >= lease.class, "a block freed twice or never handed out");
        self.stats.in_use -= lease.class;
        if let Some(h) = self.in_use_by.get_mut(&lease.account) {
            h.blocks -= 1;
            h.requested -= lease.requested;
            h.class -= lease.class;
            if h.blocks == 0 {
                self.in_use_by.remove(&lease.account);
            }
        }
        self.free.entry(lease.class).or_default().push((lease.block, fence));
    }

    /// Bytes held in cached free blocks.
    pub fn cached_bytes(&self) -> u64 {
        self.stats.reserved - self.stats.in_use
    }

    /// Gives every cached free block back to the device.
    pub fn flush(&mut self) {
        self.stats.cache_flushes += 1;
        for (class, blocks) in std::mem::take(&mut self.free) {
            for (b, _) in blocks {
                self.stats.reserved -= reserve_size(class);
                self.mem.release(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host bookkeeping: block ids, and what the device holds now.
    #[derive(Default)]
    struct Host {
        next: u32,
        held: u64,
        refuse_over: Option<u64>,
    }

    impl DeviceMemory for Host {
        type Block = (u32, u64);
        fn reserve(&mut self, bytes: u64) -> Result<(u32, u64), String> {
            if self.refuse_over.is_some_and(|r| self.held + bytes > r) {
                return Err("CUDA_ERROR_OUT_OF_MEMORY".into());
            }
            self.next += 1;
            self.held += bytes;
            Ok((self.next, bytes))
        }
        fn release(&mut self, b: (u32, u64)) {
            self.held -= b.1;
        }
    }

    #[test]
    fn sizes_round_to_pytorch_classes() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + 512);
        assert_eq!(size_class(1_304_832), 1_305_088);
        // What a block reserves: its class up to 1 MiB, then whole 2 MiB segments.
        assert_eq!(reserve_size(1 << 20), 1 << 20);
        assert_eq!(reserve_size((1 << 20) + 512), 2 << 20);
        assert_eq!(reserve_size((5 << 20) + 512), 6 << 20);
        // Saturates rather than overflows; no device has that much, so it is refused.
        assert_eq!(size_class(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_freed_block_is_reused_with_its_fence_and_the_peak_stays() {
        let mut p: DevicePool<Host, u32> = DevicePool::new(Host::default(), 1 << 30);
        let a = p.alloc("act L0 mb0", 3000).unwrap();
        let b = p.alloc("act L1 mb0", 3000).unwrap();
        assert_eq!((a.class, a.fence), (3072, None));
        let a_id = a.block.0;
        p.free(a, Some(17));
        assert_eq!(p.stats().in_use, 3072);
        assert_eq!(p.stats().peak_in_use, 6144);
        // Same class: the cached block, and the free's fence to wait on.
        let c = p.alloc("act L0 mb1", 2900).unwrap();
        assert_eq!((c.block.0, c.fence), (a_id, Some(17)));
        // Another class: a fresh block.
        let d = p.alloc("head mb0", 10_000).unwrap();
        assert_ne!(d.block.0, a_id);
        let s = p.stats();
        assert_eq!((s.reuses, s.reserves), (1, 3));
        assert_eq!(s.reserved, 3072 * 2 + size_class(10_000));
        assert_eq!(s.peak_reserved, s.reserved);
        p.free(b, None);
        p.free(c, None);
        p.free(d, None);
        assert_eq!(p.stats().in_use, 0);
        assert_eq!(p.stats().peak_in_use, s.reserved);
    }

    #[test]
    fn a_steady_alloc_free_cycle_does_not_grow() {
        let mut p: DevicePool<Host, u32> = DevicePool::new(Host::default(), 1 << 30);
        for step in 0..50u32 {
            let leases: Vec<_> = (0..8).map(|i| p.alloc("act", 1000 + i * 700_000).unwrap()).collect();
            for l in leases {
                p.free(l, Some(step));
            }
        }
        let s = p.stats();
        assert_eq!(s.reserves, 8, "{s:?}");
        assert_eq!(s.reuses, 8 * 49);
        assert_eq!(s.reserved, s.peak_reserved);
    }

    #[test]
    fn over_the_limit_the_cache_is_released_then_the_buffer_is_named() {
        let mut p: DevicePool<Host, u32> = DevicePool::new(Host::default(), 8 << 20);
        let a = p.alloc("params c0", 4 << 20).unwrap();
        p.free(a, None);
        // 6 MiB does not fit beside the cached 4 MiB: the cache goes, then it fits.
        let b = p.alloc("grads c0", 6 << 20).unwrap();
        assert_eq!(p.stats().cache_flushes, 1);
        assert_eq!(p.stats().reserved, 6 << 20);
        let e = p.alloc("act L11 mb7", 3 << 20).unwrap_err();
        assert_eq!(
            e,
            PoolError::OutOfMemory {
                buffer: "act L11 mb7".into(),
                bytes: 3 << 20,
                class: 3 << 20,
                in_use: 6 << 20,
                limit: 8 << 20
            }
        );
        assert!(e.to_string().contains("act L11 mb7") && e.to_string().contains("out of GPU memory"), "{e}");
        p.free(b, None);
        assert!(p.alloc("act L11 mb7", 3 << 20).is_ok());
    }

    #[test]
    fn blocks_are_counted_per_account_at_the_high_water_mark() {
        let mut p: DevicePool<Host, u32> = DevicePool::new(Host::default(), 1 << 30);
        let a = p.alloc("optimizer c0", 1_304_832).unwrap();
        let s1 = p.alloc_as("comm-scratch", "the shared-GPU communicator's scratch", 1000).unwrap();
        let s2 = p.alloc_as("comm-scratch", "the shared-GPU communicator's scratch", 100).unwrap();
        // A large block is its 512 B class in use, a whole 2 MiB segment reserved.
        assert_eq!(p.stats().in_use, 1_305_088 + 1024 + 512);
        assert_eq!(p.stats().reserved, (2 << 20) + 1024 + 512);
        p.free(s1, None);
        p.free(s2, None);
        let b = p.alloc("act L0 mb0", 10).unwrap();
        let peak = p.at_peak();
        assert_eq!(peak.len(), 2, "{peak:?}");
        assert_eq!(peak["optimizer c0"], Held { blocks: 1, requested: 1_304_832, class: 1_305_088 });
        assert_eq!(peak["comm-scratch"], Held { blocks: 2, requested: 1100, class: 1536 });
        assert_eq!(peak.values().map(|h| h.class).sum::<u64>(), p.stats().peak_in_use);
        p.free(a, None);
        p.free(b, None);
        // Reuse of a cached 2 MiB segment for its class, and the flush gives back its segment.
        // (`b` took the second scratch block's cached 512 B class.)
        let _ = p.alloc("optimizer c0", 1_304_800).unwrap();
        assert_eq!((p.stats().reserves, p.stats().reuses), (3, 2));
        p.flush();
        assert_eq!(p.stats().reserved, 2 << 20);
    }

    #[test]
    fn a_device_refusal_names_the_buffer() {
        let host = Host { refuse_over: Some(1 << 20), ..Host::default() };
        let mut p: DevicePool<Host, u32> = DevicePool::new(host, 1 << 30);
        let e = p.alloc("recv act vs1 mb0", 2 << 20).unwrap_err();
        assert!(matches!(&e, PoolError::Device { buffer, .. } if buffer == "recv act vs1 mb0"), "{e}");
        assert_eq!(p.stats().reserved, 0);
    }
}
