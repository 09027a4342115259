//! The protocol front ends: gRPC services that translate requests into calls
//! on the [`runtime`](crate::runtime) and its answers back into responses.

pub mod callbacks;
pub mod eager;
pub mod master;

// The services that need no job of this process (the supervisor serves them too), from salus-node: the admin API,
// `/metrics` for Prometheus (HTTP, `--metrics-listen`, a view of the admin API), the timeline and history, and
// each request's tenant.
pub use salus_node::frontend::{admin, history, identify, metrics, timeline};
