//! What a tenant's job may do on the server: salus-node's `tenant` (who a
//! tenant is, its limits, ops and checkpoint root), re-exported under the same
//! paths, and the checkpoint guard, which rewrites a job's TensorFlow graph.

pub use salus_node::tenant::*;

pub mod checkpoint_guard;
