//! Locking that survives a panic elsewhere. A leaf: it imports nothing of the
//! crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m` even if a thread panicked while holding it: the tables it guards
/// stay usable (every update is a whole insert or remove), and one failed
/// request must not poison the server for the rest.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
