//! The protocol front ends: gRPC services that translate requests into calls
//! on the [`runtime`](crate::runtime) and its answers back into responses.

pub mod admin;
pub mod callbacks;
pub mod eager;
pub mod history;
pub mod identify;
pub mod master;
/// `/metrics` for Prometheus (HTTP, `--metrics-listen`), a view of the admin API.
pub mod metrics;
pub mod timeline;
