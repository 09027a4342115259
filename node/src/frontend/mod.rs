//! The services a process serves without jobs of its own: the admin API,
//! `/metrics`, the timeline and history, and each request's tenant. The
//! TensorFlow protocols' front ends are salus-server's.

pub mod admin;
pub mod history;
pub mod identify;
pub mod metrics;
pub mod timeline;
