//! A device's allocator statistics (bytes in use and their peak), the figures
//! `tf.config.experimental.get_memory_info` reads: TensorFlow's BFC allocator
//! on a GPU keeps them, and so does its CPU allocator. They count the device
//! memory a run takes as the device sees it, kernel scratch included, which
//! neither the heap (CUDA memory is not malloc) nor allocation records do.
//!
//! An allocator is one per device per process: a reading is the process's, so
//! a job's figure comes from a run measured while no other run of the process
//! is measured (`memory_profile::TRACE_TURN`), and is an upper bound when other
//! jobs' runs overlap it.

use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;

use super::eager::EagerContext;
use super::session::Session;

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn salus_eager_device_allocator(
            ctx: *mut super::super::ffi::eager::TFE_Context,
            device: *const c_char,
            on_host: *mut c_int,
        ) -> *mut c_void;
        pub fn salus_session_device_allocator(
            session: *mut tensorflow_sys::TF_Session,
            device: *const c_char,
            on_host: *mut c_int,
        ) -> *mut c_void;
        pub fn salus_allocator_stats(
            allocator: *mut c_void,
            in_use: *mut i64,
            peak: *mut i64,
        ) -> c_int;
        pub fn salus_allocator_clear_stats(allocator: *mut c_void) -> c_int;
    }
}

/// The allocator behind one device of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAllocator {
    ptr: NonNull<c_void>,
    on_host: bool,
}

// SAFETY: TensorFlow's allocators are process-lifetime objects whose statistics
// calls take their own locks.
unsafe impl Send for DeviceAllocator {}
unsafe impl Sync for DeviceAllocator {}

/// Bytes in use now, and the most in use since the last reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorStats {
    pub in_use: u64,
    pub peak: u64,
}

impl DeviceAllocator {
    /// The allocator of `device` in an eager context: a full name, or a type
    /// and id (`GPU:0`), or empty for the default device (the first GPU, else
    /// the CPU).
    pub fn of_eager(ctx: &EagerContext, device: &str) -> Option<DeviceAllocator> {
        let name = CString::new(device).ok()?;
        let mut on_host: c_int = 1;
        // SAFETY: a live context, a NUL-terminated name and a valid out-pointer;
        // the pointer returned is an allocator that lives as long as the process.
        let ptr =
            unsafe { ffi::salus_eager_device_allocator(ctx.as_ptr(), name.as_ptr(), &mut on_host) };
        DeviceAllocator::new(ptr, on_host)
    }

    /// The allocator of `device` in a session (names as in `of_eager`).
    pub fn of_session(session: &Session, device: &str) -> Option<DeviceAllocator> {
        let name = CString::new(device).ok()?;
        let mut on_host: c_int = 1;
        // SAFETY: as `of_eager`, with a live session.
        let ptr = unsafe {
            ffi::salus_session_device_allocator(session.as_ptr(), name.as_ptr(), &mut on_host)
        };
        DeviceAllocator::new(ptr, on_host)
    }

    fn new(ptr: *mut c_void, on_host: c_int) -> Option<DeviceAllocator> {
        NonNull::new(ptr).map(|ptr| DeviceAllocator {
            ptr,
            on_host: on_host != 0,
        })
    }

    /// Whether the device's memory is the host's (a CPU device), where kernels
    /// also take memory the allocator never sees (Eigen's scratch is malloc).
    pub fn on_host(&self) -> bool {
        self.on_host
    }

    /// Its statistics, when it keeps any.
    pub fn stats(&self) -> Option<AllocatorStats> {
        let (mut in_use, mut peak) = (0i64, 0i64);
        // SAFETY: a live allocator and two valid out-pointers.
        let kept: c_int =
            unsafe { ffi::salus_allocator_stats(self.ptr.as_ptr(), &mut in_use, &mut peak) };
        (kept == 1).then_some(AllocatorStats {
            in_use: in_use.max(0) as u64,
            peak: peak.max(0) as u64,
        })
    }

    /// Runs `run` and returns, with its result, the most the allocator had in
    /// use during it above what it had at its start (None when the allocator
    /// keeps no statistics or cannot reset its peak).
    pub fn measure<R>(&self, run: impl FnOnce() -> R) -> (R, Option<u64>) {
        let before = self.stats();
        // SAFETY: a live allocator.
        let reset = unsafe { ffi::salus_allocator_clear_stats(self.ptr.as_ptr()) } == 1;
        let result = run();
        let rise = match (before, reset, self.stats()) {
            (Some(before), true, Some(after)) => Some(after.peak.saturating_sub(before.in_use)),
            _ => None,
        };
        (result, rise)
    }
}
