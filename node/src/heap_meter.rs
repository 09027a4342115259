//! How much heap a stretch of work takes, measured at the allocator.
//!
//! TensorFlow 2.21 records no memory for eager function calls (the run
//! metadata of `TFE_ContextEnableRunMetadata` comes back empty, and with the
//! system allocator `get_memory_info` has no statistics on CPU), so an eager
//! job's per-iteration memory is measured here instead: the server binary
//! defines the `malloc` family itself (`malloc_hooks.rs`, forwarding to glibc),
//! which makes every allocation in the process, TensorFlow's included, pass
//! through [`on_alloc`] and [`on_free`]. Outside a [`measure`] window they cost
//! one relaxed load.
//!
//! The figure is the peak rise of the process's live heap bytes during the
//! window: the work's own peak, plus or minus whatever other threads allocate
//! or free meanwhile. Callers take it while the job holds its iteration turn
//! and keep the largest of a few samples, as for graph jobs' traced runs.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

/// Whether a window is open: the hooks count only then.
static METERING: AtomicBool = AtomicBool::new(false);
/// Set once the binary's hooks were seen counting (see [`install`]).
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed since the window opened.
static NET: AtomicI64 = AtomicI64::new(0);
/// The highest `NET` reached in the window.
static PEAK: AtomicI64 = AtomicI64::new(0);
/// One window at a time: the counters are process-wide.
static WINDOW: Mutex<()> = Mutex::new(());

/// The size glibc really reserved for a block: the same figure at allocation
/// and at release, so a window's allocations and frees cancel exactly.
#[inline]
fn usable_size(ptr: *mut c_void) -> i64 {
    // SAFETY: `ptr` is a live block from glibc's malloc family (callers pass
    // only non-null results, or blocks about to be freed).
    unsafe { libc::malloc_usable_size(ptr) as i64 }
}

/// Called by the allocation hooks with each new block.
#[inline]
pub fn on_alloc(ptr: *mut c_void) {
    if METERING.load(Ordering::Relaxed) && !ptr.is_null() {
        let bytes = usable_size(ptr);
        let now = NET.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

/// Called by the release hooks with each block about to be freed.
#[inline]
pub fn on_free(ptr: *mut c_void) {
    if METERING.load(Ordering::Relaxed) && !ptr.is_null() {
        NET.fetch_sub(usable_size(ptr), Ordering::Relaxed);
    }
}

/// Bytes in live heap blocks now (glibc's count, all arenas, less the blocks
/// [`crate::block_cache`] keeps): unlike RSS, not the freed memory the heap
/// keeps for reuse (`tf_env` never trims it).
pub fn heap_in_use() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo2() };
        ((info.uordblks + info.hblkhd) as u64)
            .saturating_sub(crate::block_cache::cached_bytes() as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

/// Returns the heap's free memory to the system (the blocks
/// [`crate::block_cache`] keeps, then glibc's `malloc_trim`): `tf_env` turns
/// automatic trimming off so that one step's freed memory is there for the
/// next, so after a job ends (its context's tensors and caches freed) this is
/// what brings RSS back down. Unless `now` (the last job ended), at most once a
/// second: a trim walks the whole heap.
pub fn return_free_memory(now: bool) {
    static LAST_SECOND: AtomicI64 = AtomicI64::new(0);
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if LAST_SECOND.swap(second, Ordering::Relaxed) == second && !now {
        return;
    }
    crate::block_cache::drain();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Checks that the process's `malloc` is the metered one (the server binary's
/// hooks) and enables [`measure`]. Returns whether it is.
pub fn install() -> bool {
    let (_, seen) = window(|| {
        // SAFETY: a plain allocation, freed at once; the libc crate's `malloc`
        // resolves to the process's definition, hooked or not.
        unsafe {
            let block = std::hint::black_box(libc::malloc(64 << 10));
            libc::free(block);
        }
    });
    let installed = seen.is_some_and(|bytes| bytes >= 64 << 10);
    INSTALLED.store(installed, Ordering::SeqCst);
    installed
}

/// Runs `work` and returns the peak rise of the process's heap during it, or
/// `None` when the allocator is not metered or another window is open (then
/// `work` still runs, unmeasured).
pub fn measure<T>(work: impl FnOnce() -> T) -> (T, Option<u64>) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return (work(), None);
    }
    window(work)
}

/// `work` inside a window when none is open (peak in bytes), else unmeasured.
fn window<T>(work: impl FnOnce() -> T) -> (T, Option<u64>) {
    let Ok(_only) = WINDOW.try_lock() else {
        return (work(), None);
    };
    NET.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    METERING.store(true, Ordering::SeqCst);
    let result = work();
    METERING.store(false, Ordering::SeqCst);
    (result, Some(PEAK.load(Ordering::SeqCst).max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters are process-wide: these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn counts_only_inside_a_window_and_keeps_the_peak() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // Unit tests run without the binary's hooks: drive the counters directly.
        let block = Box::into_raw(vec![0u8; 1 << 20].into_boxed_slice()).cast::<c_void>();
        on_alloc(block); // no window: ignored
        let ((), peak) = window(|| {
            on_alloc(block);
            on_free(block);
            on_alloc(block);
        });
        let one = usable_size(block) as u64;
        assert!(one >= 1 << 20);
        assert_eq!(peak, Some(one));
        // SAFETY: the block came from Box::into_raw above, with this layout.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                block.cast::<u8>(),
                1 << 20,
            ))
        });
    }

    #[test]
    fn a_second_window_runs_its_work_unmeasured() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (inner, outer_peak) = window(|| window(|| 7));
        assert_eq!(inner, (7, None));
        assert!(outer_peak.is_some());
    }

    #[test]
    fn measure_without_the_hooks_reports_nothing() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!install(), "unit tests run with glibc's own malloc");
        assert_eq!(measure(|| 3), (3, None));
    }
}
