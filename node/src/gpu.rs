//! GPU memory from the CUDA driver (cargo feature `cuda`). cudarc loads
//! libcuda at run time, so the server builds and starts without CUDA; on a host
//! without a driver the query fails with an error instead.
//!
//! Verified: it compiles (CI runs `cargo check --features cuda`). Not verified
//! on a GPU in this project yet.

/// Why the GPU's memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("the CUDA driver (libcuda) could not be loaded")]
    NoDriver,
    #[error("CUDA driver error: {0}")]
    Driver(String),
}

/// Memory of one GPU, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total: u64,
    pub free: u64,
}

/// The names the CUDA driver library goes by (the driver package installs
/// the versioned one; the unversioned one comes with development files).
const DRIVER_LIBRARIES: [&std::ffi::CStr; 2] = [c"libcuda.so.1", c"libcuda.so"];

/// Whether the CUDA driver library can be loaded at all.
fn driver_present() -> bool {
    DRIVER_LIBRARIES.iter().any(|name| {
        // SAFETY: dlopen with a NUL-terminated name; the handle is closed
        // right away (cudarc opens the library itself).
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return false;
        }
        // SAFETY: a handle dlopen returned, closed once.
        unsafe { libc::dlclose(handle) };
        true
    })
}

/// Total and free memory of GPU `ordinal`.
pub fn device_memory(ordinal: usize) -> Result<DeviceMemory, GpuError> {
    // Asked first, so a host without a driver (the GPU wheel on a CPU machine)
    // gets the error without cudarc's panic message on stderr.
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    // cudarc panics when libcuda cannot be loaded after all; that is an error
    // here, not a crash.
    let query = std::panic::catch_unwind(|| {
        let context = cudarc::driver::CudaContext::new(ordinal)?;
        context.mem_get_info()
    });
    match query {
        Ok(Ok((free, total))) => Ok(DeviceMemory {
            total: total as u64,
            free: free as u64,
        }),
        Ok(Err(err)) => Err(GpuError::Driver(err.to_string())),
        Err(_) => Err(GpuError::NoDriver),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_the_driver_gets_no_driver() {
        if driver_present() {
            return; // a GPU host: the query itself is for scripts/gpu_check.sh
        }
        assert!(matches!(device_memory(0), Err(GpuError::NoDriver)));
    }
}
