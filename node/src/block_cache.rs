//! Large freed heap blocks kept for the next request of about their size.
//!
//! The server leaves TensorFlow's CPU tensors to glibc (`tf_env`), and glibc
//! gives a thread's large block a fresh 64 MiB heap when the thread's arena has
//! no room, then unmaps that heap the moment the block is freed, whatever the
//! trim threshold says. A training step that allocates and frees the same
//! activations every iteration then pays for every page again (measured on
//! `bench_master.py`'s CNN: 500-1700 page faults a step, steps 3-11% slower
//! than in-process TensorFlow, whose own pooling allocator keeps the memory).
//!
//! The binary's `free` (`malloc_hooks.rs`) hands blocks of at least
//! [`MIN_BYTES`] here instead, and its `malloc` family takes a kept block that
//! fits before asking glibc. The blocks stay glibc's (a kept block is a live
//! glibc block, so `realloc`, `malloc_usable_size` and `free` work on it as on
//! any other), the heap meter counts the requests and releases the program
//! made, not the cache's, and a request glibc cannot satisfy fails at once
//! after the cache was emptied and glibc asked again: no waiting under a lock,
//! the reason the server does not use oneDNN's pooling allocator.
//!
//! The cache holds at most [`SLOTS`] blocks and `--block-cache` bytes
//! (default [`DEFAULT_MAX_BYTES`]; 0 turns it off); the oldest kept block
//! goes back to glibc first. It is emptied when a job's memory is handed back
//! ([`crate::heap_meter::return_free_memory`]).

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Smaller blocks are left to glibc: its arenas reuse them well.
pub const MIN_BYTES: usize = 1 << 20;
/// How many blocks the cache holds.
pub const SLOTS: usize = 32;
/// The bytes the cache holds unless `--block-cache` says otherwise.
pub const DEFAULT_MAX_BYTES: usize = 512 << 20;

/// A kept block serves a request at most this many times smaller, plus one:
/// a 4 MiB request does not take a 64 MiB block.
const SLACK_DIVISOR: usize = 4;

/// Where blocks go when they leave the cache (glibc's own `free`).
pub type Release = unsafe extern "C" fn(*mut c_void);

#[derive(Clone, Copy)]
struct Slot {
    /// The block's address; 0 for an empty slot.
    addr: usize,
    /// `malloc_usable_size` of the block.
    bytes: usize,
    /// When it was kept (a counter): the smallest goes first.
    kept_at: u64,
}

const EMPTY: Slot = Slot {
    addr: 0,
    bytes: 0,
    kept_at: 0,
};

struct Blocks {
    slots: [Slot; SLOTS],
    clock: u64,
}

/// The cache's state behind a spin lock: it is taken inside `malloc` and
/// `free`, where nothing may allocate, and held for a scan of [`SLOTS`] slots.
struct Cache {
    locked: AtomicBool,
    blocks: UnsafeCell<Blocks>,
}

// SAFETY: `blocks` is only touched while `locked` is held (see `with_blocks`).
unsafe impl Sync for Cache {}

static CACHE: Cache = Cache {
    locked: AtomicBool::new(false),
    blocks: UnsafeCell::new(Blocks {
        slots: [EMPTY; SLOTS],
        clock: 0,
    }),
};
/// The cache's size limit; 0 until [`enable`] (then blocks are never kept).
static MAX_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes in kept blocks now.
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Where evicted and drained blocks go; set by [`enable`].
static RELEASE: AtomicUsize = AtomicUsize::new(0);

fn lock() {
    let mut spins = 0u32;
    while CACHE
        .locked
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn unlock() {
    CACHE.locked.store(false, Ordering::Release);
}

fn with_blocks<T>(work: impl FnOnce(&mut Blocks) -> T) -> T {
    lock();
    // SAFETY: the lock is held, so this is the only reference.
    let result = work(unsafe { &mut *CACHE.blocks.get() });
    unlock();
    result
}

/// Turns the cache on: blocks leave it through `release`, it holds at most
/// `max_bytes` (0: nothing is kept). Call before threads start.
pub fn enable(release: Release, max_bytes: usize) {
    RELEASE.store(release as usize, Ordering::SeqCst);
    MAX_BYTES.store(max_bytes, Ordering::SeqCst);
    static FORK_HANDLERS: std::sync::Once = std::sync::Once::new();
    #[cfg(unix)]
    FORK_HANDLERS.call_once(|| {
        // A child forked while another thread held the lock would wait for it
        // forever at its first large allocation: hold it across fork.
        // SAFETY: the handlers only take and drop the spin lock.
        unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_done), Some(fork_done));
        }
    });
}

extern "C" fn fork_prepare() {
    lock();
}

extern "C" fn fork_done() {
    unlock();
}

fn release(addr: usize) {
    let release = RELEASE.load(Ordering::Relaxed);
    if addr != 0 && release != 0 {
        // SAFETY: RELEASE holds a `Release` set by `enable`; `addr` is a block
        // the cache owned.
        unsafe {
            let release: Release = std::mem::transmute(release);
            release(addr as *mut c_void);
        }
    }
}

/// A kept block of at least `size` bytes aligned to `align`, if one fits
/// (the smallest that does); null otherwise.
pub fn take(size: usize, align: usize) -> *mut c_void {
    if size < MIN_BYTES || CACHED_BYTES.load(Ordering::Relaxed) == 0 {
        return std::ptr::null_mut();
    }
    let most = size.saturating_add(size / SLACK_DIVISOR);
    let align = align.max(1);
    with_blocks(|blocks| {
        let best = blocks
            .slots
            .iter_mut()
            .filter(|s| s.addr != 0 && s.bytes >= size && s.bytes <= most && s.addr % align == 0)
            .min_by_key(|s| s.bytes);
        match best {
            Some(slot) => {
                let addr = slot.addr;
                CACHED_BYTES.fetch_sub(slot.bytes, Ordering::Relaxed);
                *slot = EMPTY;
                addr as *mut c_void
            }
            None => std::ptr::null_mut(),
        }
    })
}

/// Keeps a freed block of `bytes` usable bytes; `false` when the caller should
/// free it itself (too small, too large for the cache, or the cache is off).
/// Older blocks make room, going back through the release function.
pub fn keep(ptr: *mut c_void, bytes: usize) -> bool {
    let max = MAX_BYTES.load(Ordering::Relaxed);
    if ptr.is_null() || bytes < MIN_BYTES || bytes > max {
        return false;
    }
    let mut evicted = [0usize; SLOTS];
    with_blocks(|blocks| {
        blocks.clock += 1;
        let mut held = CACHED_BYTES.load(Ordering::Relaxed);
        let mut n = 0;
        loop {
            let free_slot = blocks.slots.iter().any(|s| s.addr == 0);
            if free_slot && held + bytes <= max {
                break;
            }
            let oldest = blocks
                .slots
                .iter_mut()
                .filter(|s| s.addr != 0)
                .min_by_key(|s| s.kept_at)
                .expect("a full or over-budget cache holds a block");
            evicted[n] = oldest.addr;
            n += 1;
            held -= oldest.bytes;
            *oldest = EMPTY;
        }
        let slot = blocks
            .slots
            .iter_mut()
            .find(|s| s.addr == 0)
            .expect("a slot was made free");
        *slot = Slot {
            addr: ptr as usize,
            bytes,
            kept_at: blocks.clock,
        };
        CACHED_BYTES.store(held + bytes, Ordering::Relaxed);
    });
    // Released outside the lock: glibc may unmap a heap meanwhile.
    evicted.into_iter().for_each(release);
    true
}

/// Sends every kept block back to glibc; returns whether there were any.
pub fn drain() -> bool {
    if CACHED_BYTES.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let mut drained = [0usize; SLOTS];
    with_blocks(|blocks| {
        for (out, slot) in drained.iter_mut().zip(blocks.slots.iter_mut()) {
            *out = slot.addr;
            *slot = EMPTY;
        }
        CACHED_BYTES.store(0, Ordering::Relaxed);
    });
    drained.into_iter().for_each(release);
    true
}

/// Whether blocks may be kept (`enable` with a size above 0).
#[inline]
pub fn is_enabled() -> bool {
    MAX_BYTES.load(Ordering::Relaxed) != 0
}

/// Bytes in kept blocks: live to glibc, free to the program.
pub fn cached_bytes() -> usize {
    CACHED_BYTES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The cache is process-wide: these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    unsafe extern "C" fn glibc_free(ptr: *mut c_void) {
        libc::free(ptr);
    }

    fn block(bytes: usize) -> (*mut c_void, usize) {
        // SAFETY: plain allocations (unit tests run on glibc's own malloc).
        let ptr = unsafe { libc::malloc(bytes) };
        assert!(!ptr.is_null());
        // SAFETY: a live block.
        (ptr, unsafe { libc::malloc_usable_size(ptr) })
    }

    fn fresh(max: usize) -> std::sync::MutexGuard<'static, ()> {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable(glibc_free, max);
        drain();
        guard
    }

    #[test]
    fn a_kept_block_serves_the_next_request_of_its_size_only() {
        let _serial = fresh(64 << 20);
        let (ptr, bytes) = block(8 << 20);
        assert!(keep(ptr, bytes));
        assert_eq!(cached_bytes(), bytes);
        assert!(
            take(1 << 20, 16).is_null(),
            "an 8 MiB block is too big for 1 MiB"
        );
        assert!(take(9 << 20, 16).is_null(), "and too small for 9 MiB");
        assert_eq!(take(8 << 20, 16), ptr);
        assert_eq!(cached_bytes(), 0);
        assert!(take(8 << 20, 16).is_null(), "a block is handed out once");
        // SAFETY: the block came back from the cache, so it is ours again.
        unsafe { libc::free(ptr) };
    }

    #[test]
    fn small_blocks_and_a_disabled_cache_are_left_to_the_caller() {
        let _serial = fresh(0);
        let (big, big_bytes) = block(2 << 20);
        assert!(!keep(big, big_bytes), "a cache of 0 bytes keeps nothing");
        enable(glibc_free, 64 << 20);
        let (small, small_bytes) = block(4096);
        assert!(!keep(small, small_bytes));
        // SAFETY: neither block was kept.
        unsafe {
            libc::free(small);
            libc::free(big);
        }
    }

    #[test]
    fn the_oldest_block_makes_room_and_drain_empties() {
        let _serial = fresh(5 << 20);
        let (a, a_bytes) = block(2 << 20);
        let (b, b_bytes) = block(2 << 20);
        let (c, c_bytes) = block(2 << 20);
        assert!(keep(a, a_bytes) && keep(b, b_bytes));
        assert!(keep(c, c_bytes), "a, the oldest, went back to glibc");
        assert_eq!(cached_bytes(), b_bytes + c_bytes);
        let first = take(2 << 20, 16);
        let second = take(2 << 20, 16);
        assert!([first, second].contains(&b) && [first, second].contains(&c));
        assert!(keep(b, b_bytes) && keep(c, c_bytes));
        assert!(drain());
        assert_eq!(cached_bytes(), 0);
        assert!(!drain());
        assert!(take(2 << 20, 16).is_null());
    }

    #[test]
    fn alignment_is_respected() {
        let _serial = fresh(64 << 20);
        // SAFETY: a plain aligned allocation.
        let ptr = unsafe { libc::memalign(64, 2 << 20) };
        assert!(!ptr.is_null() && ptr as usize % 64 == 0);
        // SAFETY: a live block.
        let bytes = unsafe { libc::malloc_usable_size(ptr) };
        assert!(keep(ptr, bytes));
        // An alignment the block misses (the lowest power of two above its own).
        let misses = 1usize << ((ptr as usize).trailing_zeros() + 1);
        assert!(take(2 << 20, misses).is_null());
        assert_eq!(take(2 << 20, 64), ptr);
        // SAFETY: back from the cache.
        unsafe { libc::free(ptr) };
    }
}
