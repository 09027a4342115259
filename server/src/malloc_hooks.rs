//! The server binary's `malloc` family (compiled into `main.rs` only).
//!
//! Defined in the executable, these symbols take the place of glibc's for the
//! whole process: the dynamic linker binds TensorFlow's libraries (and Rust's
//! own allocator) to the executable's definitions first. Each forwards to
//! glibc's implementation through its `__libc_*` entry point, so the heap,
//! its tuning (`tf_env`) and a block's owner stay glibc's; the only addition
//! is [`heap_meter`]'s counting while a measurement window is open. No block
//! gets a header, so a block allocated or freed by a path that bypasses these
//! (glibc's internal calls) is still valid everywhere.
//!
//! Large freed blocks go to [`block_cache`] instead of glibc, and large
//! requests take a fitting one from there first (see that module for why).
//! A request glibc refuses is asked again once the cache was emptied.

use std::ffi::{c_int, c_void};

use salus_server::block_cache;
use salus_server::heap_meter::{on_alloc, on_free};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_memalign(alignment: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let mut ptr = block_cache::take(size, 1);
    if ptr.is_null() {
        ptr = retried(|| __libc_malloc(size));
    }
    on_alloc(ptr);
    ptr
}

/// Starts the block cache (`--block-cache`), releasing through glibc's `free`.
pub fn enable_block_cache(max_bytes: usize) {
    block_cache::enable(__libc_free, max_bytes);
}

/// `alloc()`, and when glibc refused and the cache held blocks, `alloc()`
/// again after they went back to glibc: an allocation fails only when nothing
/// is held.
#[inline]
unsafe fn retried(alloc: impl Fn() -> *mut c_void) -> *mut c_void {
    let ptr = alloc();
    if ptr.is_null() && block_cache::drain() {
        alloc()
    } else {
        ptr
    }
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let ptr = retried(|| __libc_calloc(count, size));
    on_alloc(ptr);
    ptr
}

/// # Safety
/// The C `realloc` contract: `ptr` is null or a live block of this heap.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // Counted as a release and a new block; if glibc fails, the old block
    // stays live and is counted back.
    on_free(ptr);
    let new = if size == 0 {
        __libc_realloc(ptr, 0) // frees `ptr`: never asked twice
    } else {
        retried(|| __libc_realloc(ptr, size))
    };
    if new.is_null() && size != 0 {
        on_alloc(ptr);
    } else {
        on_alloc(new);
    }
    new
}

/// # Safety
/// The C `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    on_free(ptr);
    // The block's size is only looked up when the cache could keep it.
    if !(block_cache::is_enabled() && block_cache::keep(ptr, libc::malloc_usable_size(ptr))) {
        __libc_free(ptr);
    }
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    let mut ptr = block_cache::take(size, alignment);
    if ptr.is_null() {
        ptr = retried(|| __libc_memalign(alignment, size));
    }
    on_alloc(ptr);
    ptr
}

/// # Safety
/// The C11 `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    if !alignment.is_power_of_two() {
        *libc::__errno_location() = libc::EINVAL;
        return std::ptr::null_mut();
    }
    memalign(alignment, size)
}

/// # Safety
/// The POSIX `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    if !alignment.is_power_of_two() || !alignment.is_multiple_of(std::mem::size_of::<*mut c_void>())
    {
        return libc::EINVAL;
    }
    let ptr = memalign(alignment, size);
    if ptr.is_null() {
        return libc::ENOMEM;
    }
    *out = ptr;
    0
}

/// # Safety
/// The `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    let ptr = retried(|| __libc_valloc(size));
    on_alloc(ptr);
    ptr
}

/// # Safety
/// The `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let ptr = retried(|| __libc_pvalloc(size));
    on_alloc(ptr);
    ptr
}
