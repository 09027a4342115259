//! GPU 0 as the CUDA driver reports it, asked once at start (a `cuda` build
//! only), and where the memory capacity comes from. `salus info` shows both, so
//! a user (and scripts/gpu_check.sh) can tell whether the server sees the GPU.

/// Memory of one GPU, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemory {
    pub total: u64,
    pub free: u64,
}

/// What the driver said about GPU 0 at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProbe {
    /// Built with the `cuda` feature: only such a build asks the driver.
    pub cuda_build: bool,
    /// The figures, or why there are none.
    pub memory: Result<GpuMemory, String>,
}

impl GpuProbe {
    /// Asks the driver (a `cuda` build); a CPU build says it did not ask.
    pub fn of_gpu0() -> GpuProbe {
        #[cfg(feature = "cuda")]
        {
            GpuProbe {
                cuda_build: true,
                memory: crate::gpu::device_memory(0)
                    .map(|m| GpuMemory {
                        total: m.total,
                        free: m.free,
                    })
                    .map_err(|e| e.to_string()),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            GpuProbe::not_asked()
        }
    }

    /// A build without the `cuda` feature (and the default of tests).
    pub fn not_asked() -> GpuProbe {
        GpuProbe {
            cuda_build: false,
            memory: Err("this salus-server was built without the cuda feature \
                         (scripts/setup.sh builds it with cuda where an NVIDIA driver is present)"
                .into()),
        }
    }
}

impl Default for GpuProbe {
    fn default() -> Self {
        GpuProbe::not_asked()
    }
}

/// Where the memory capacity lanes share comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapacitySource {
    /// `--memory-capacity`.
    Flag,
    /// GPU 0's memory from the CUDA driver.
    Cuda,
    /// No capacity: memory admission is off.
    #[default]
    None,
}

impl CapacitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacitySource::Flag => "flag",
            CapacitySource::Cuda => "cuda",
            CapacitySource::None => "none",
        }
    }
}

/// The capacity lanes share: `--memory-capacity`, else GPU 0's memory when the
/// driver answered (all of it for dynamic lanes; 95% of what is free for GPU
/// lanes, which TensorFlow must allocate at start).
pub fn memory_capacity(
    flag: Option<u64>,
    gpu_lanes: u32,
    probe: &GpuProbe,
) -> (Option<u64>, CapacitySource) {
    if let Some(bytes) = flag {
        return (Some(bytes), CapacitySource::Flag);
    }
    match &probe.memory {
        Ok(memory) if gpu_lanes > 0 => (Some(memory.free / 20 * 19), CapacitySource::Cuda),
        Ok(memory) => (Some(memory.total), CapacitySource::Cuda),
        Err(_) => (None, CapacitySource::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(total: u64, free: u64) -> GpuProbe {
        GpuProbe {
            cuda_build: true,
            memory: Ok(GpuMemory { total, free }),
        }
    }

    #[test]
    fn the_flag_wins_over_the_driver() {
        assert_eq!(
            memory_capacity(Some(1 << 30), 0, &gpu(80 << 30, 79 << 30)),
            (Some(1 << 30), CapacitySource::Flag)
        );
    }

    #[test]
    fn the_driver_gives_all_for_dynamic_lanes_and_95_percent_of_free_for_gpu_lanes() {
        let probe = gpu(80 << 30, 40 << 30);
        assert_eq!(
            memory_capacity(None, 0, &probe),
            (Some(80 << 30), CapacitySource::Cuda)
        );
        assert_eq!(
            memory_capacity(None, 2, &probe),
            (Some((40u64 << 30) / 20 * 19), CapacitySource::Cuda)
        );
    }

    #[test]
    fn no_driver_and_no_flag_is_no_admission() {
        assert_eq!(
            memory_capacity(None, 0, &GpuProbe::not_asked()),
            (None, CapacitySource::None)
        );
        let failed = GpuProbe {
            cuda_build: true,
            memory: Err("the CUDA driver (libcuda) could not be loaded".into()),
        };
        assert_eq!(
            memory_capacity(None, 2, &failed),
            (None, CapacitySource::None)
        );
    }
}
