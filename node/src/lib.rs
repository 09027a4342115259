//! # salus-node
//!
//! What a node's processes share without TensorFlow: the flags, the tenants,
//! the scheduler's executor core and memory admission, the admin API and
//! `/metrics`, the seam between a supervisor and its executors, and the
//! supervisor itself. The `salus-supervisor` binary (crate salus-supervisor)
//! is built from this crate alone, so it cannot link TensorFlow; salus-server
//! adds the front ends, the jobs and TensorFlow's bindings on top and
//! re-exports these modules under the same paths.
//!
//! # Layout
//! - [`config`]: command-line flags and the validated [`config::Config`];
//!   [`config_file`]: `--config FILE` (the flags as TOML keys) merged under them.
//! - [`reload`]: `salus reload` and SIGHUP, the flags, config and tenants files
//!   read again; [`runtime::settings`]: what admins change at run time
//!   (policy, limits, hints, drain), kept in the state directory.
//! - [`node_start`]: every role's start ([`node_start::Role`]: the whole server,
//!   the supervisor, a tenant's executor); [`runtime::node`] is what it gives.
//! - [`process`]: what the two binaries (`salus-server`, `salus-supervisor`)
//!   do as processes.
//! - [`frontend`]: the services that need no job of this process: the admin
//!   API ([`frontend::admin`]), `/metrics`, the timeline and history, and each
//!   request's tenant ([`frontend::identify`]).
//! - [`runtime`]: the scheduler port ([`runtime::sched_port`]) and the core
//!   driven by lane threads ([`runtime::executor`]), memory admission, run
//!   classes, the timeline, the rows of the admin API's jobs.
//! - [`tenant`]: who a tenant is and what its jobs may do (the checkpoint
//!   guard, which rewrites TensorFlow graphs, is salus-server's).
//! - [`supervisor`]: the process users start under `--isolation tenant`;
//!   [`seam`]: the protocol between it and the tenants' executors.
//! - [`tf_types`]: TensorFlow's errors and device descriptions as plain data.
//! - [`state_dir`], [`listen_fds`], [`log_json`], [`tf_env`], [`tf_log`],
//!   [`heap_meter`], [`block_cache`], [`gpu_probe`]: the process's state
//!   directory, passed sockets, logs, TensorFlow's environment and stderr,
//!   heap figures and the GPU's capacity.
//! - Leaves: [`wire`] (protobuf field editing), [`sync`] (a lock that survives
//!   a panic elsewhere), [`http2`] (the HTTP/2 bytes the supervisor speaks
//!   itself), [`error`] (the error type and its gRPC/TensorFlow codes).

pub mod block_cache;
pub mod config;
pub mod config_file;
pub mod error;
pub mod frontend;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod gpu_probe;
pub mod heap_meter;
pub mod http2;
pub mod listen_fds;
pub mod log_json;
pub mod node_start;
pub mod process;
pub mod reload;
pub mod runtime;
pub mod seam;
pub mod state_dir;
pub mod supervisor;
pub mod sync;
pub mod tenant;
pub mod tf_env;
pub mod tf_log;
pub mod tf_types;
pub mod wire;

/// The scheduler core, shared with the simulator (crate `salus-sched`).
pub use salus_sched as sched;
pub use salus_sched::units;
