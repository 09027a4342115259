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

/// Total and free memory of GPU `ordinal`.
pub fn device_memory(ordinal: usize) -> Result<DeviceMemory, GpuError> {
    // cudarc panics when libcuda is missing; that is an error here, not a crash.
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
