//! TensorFlow settings the server chooses through the environment.

/// TensorFlow's oneDNN CPU allocator, by default, retries a failed large
/// allocation for 10 s while holding a lock that every release in the process
/// needs: one tenant's out-of-memory step would freeze every job. The system
/// allocator fails at once. An explicit setting in the environment wins.
const SYSTEM_ALLOCATOR: &str = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR";

/// With the system allocator, glibc serves every block over 128 KiB (a conv's
/// activations and scratch) with a fresh mmap and returns it with munmap: each
/// step pays page faults that TensorFlow's own allocator would not (measured:
/// a Keras CNN step about 7-15% slower). Blocks up to this size come from the
/// heap and are reused instead; a request the heap cannot hold still fails at
/// once, which is what the system allocator is for.
///
/// Not every such block is reused by glibc: a thread's own arena (glibc gives
/// TensorFlow's threads arenas of their own) grows in heaps of at most 64 MiB,
/// and a block that does not fit gets a fresh heap that glibc unmaps as soon as
/// it is free, whatever the trim threshold (measured on the TF1 CNN of
/// `bench_master.py`: 500-1700 page faults a step, steps 3-11% slower than
/// in-process). The binary's `free` keeps such blocks for reuse instead
/// ([`crate::block_cache`]).
const MMAP_THRESHOLD_BYTES: i32 = 1 << 30;
/// The heap is not trimmed while less than this much of its top is free, so
/// memory freed by one step is there for the next.
const TRIM_THRESHOLD_BYTES: i32 = i32::MAX;

/// TensorFlow maps nearly all of a GPU's memory into the first process that
/// uses it. Each tenant's executor is a process of its own (and the supervisor
/// lists devices with a session too), so the first would leave the others
/// nothing: each grows its GPU memory as its jobs need it instead. Memory
/// lanes are the server's budgets, not TensorFlow's reservations. (`--gpu-lanes`
/// virtual GPUs keep their fixed sizes.)
const GPU_ALLOW_GROWTH: &str = "TF_FORCE_GPU_ALLOW_GROWTH";

/// CUDA numbers GPUs fastest first; nvidia-smi, the NVIDIA container toolkit
/// and cluster engines number them by PCI bus. The server's "GPU 0" is the one
/// they call 0.
const DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER";

/// The variables set here when the environment does not set them (executors
/// inherit them).
const DEFAULTS: [(&str, &str); 3] = [
    (SYSTEM_ALLOCATOR, "true"),
    (GPU_ALLOW_GROWTH, "true"),
    (DEVICE_ORDER, "PCI_BUS_ID"),
];

/// Call first thing in `main`, before any thread starts and before TensorFlow
/// creates its allocators (it reads the variables when it first allocates).
pub fn prepare() {
    for (name, value) in DEFAULTS {
        if std::env::var_os(name).is_none() {
            // SAFETY (edition 2024 would require `unsafe`): single-threaded here.
            std::env::set_var(name, value);
        }
    }
    tune_malloc();
}

/// glibc's mmap and trim thresholds (see above), unless the environment sets
/// them (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (param, env, value) in [
        (
            libc::M_MMAP_THRESHOLD,
            "MALLOC_MMAP_THRESHOLD_",
            MMAP_THRESHOLD_BYTES,
        ),
        (
            libc::M_TRIM_THRESHOLD,
            "MALLOC_TRIM_THRESHOLD_",
            TRIM_THRESHOLD_BYTES,
        ),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only sets allocator parameters; called before other threads start.
            unsafe { libc::mallopt(param, value) };
        }
    }
}
