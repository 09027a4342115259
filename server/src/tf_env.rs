//! TensorFlow settings the server chooses through the environment.

/// TensorFlow's oneDNN CPU allocator, by default, retries a failed large
/// allocation for 10 s while holding a lock that every release in the process
/// needs: one tenant's out-of-memory step would freeze every job. The system
/// allocator fails at once. An explicit setting in the environment wins.
const SYSTEM_ALLOCATOR: &str = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR";

/// Call first thing in `main`, before any thread starts and before TensorFlow
/// creates its allocators (it reads the variable when it first allocates).
pub fn prepare() {
    if std::env::var_os(SYSTEM_ALLOCATOR).is_none() {
        // SAFETY (edition 2024 would require `unsafe`): single-threaded here.
        std::env::set_var(SYSTEM_ALLOCATOR, "true");
    }
}
