//! # salus-server
//!
//! One process that runs many TensorFlow jobs. Stock TensorFlow clients connect
//! with `tf.compat.v1.Session("grpc://HOST:PORT")` and speak TensorFlow's master
//! protocol; the server executes their graphs through TensorFlow's C API.
//!
//! # Layout
//! - [`config`]: command-line flags and the validated [`config::Config`].
//! - [`server`]: assembles the gRPC services and runs them until shutdown.
//! - [`master`]: `tensorflow.MasterService`, one handler per RPC.
//! - [`sched`] (crate `salus-sched`): the scheduler core and memory lanes.
//! - [`admission`]: memory lanes for jobs, waiting, RAII reservations.
//! - [`admin`]: `salus.v1.Admin`, the server's own status API.
//! - [`state`], [`sessions`], [`job`]: shared state, the session table, one job.
//! - `gpu` (feature `cuda`): GPU memory from the CUDA driver, loaded at run time.
//! - [`graph_delta`]: checks (delta) GraphDefs before import.
//! - [`tenant`], [`op_policy`], [`checkpoint_guard`]: the tenant boundary:
//!   refused ops, checkpoint paths confined to the job's directory, limits.
//! - [`memory_profile`]: a run's memory peak from TF's step stats.
//! - [`session_config`]: client ConfigProto -> server-side session config.
//! - [`tf`]: safe wrappers over TensorFlow's C API.
//! - [`tf_log`]: filters TensorFlow's own log lines out of stderr.
//! - [`tf_env`]: TensorFlow settings chosen through the environment.
//! - [`exec`]: runs TensorFlow work off the async runtime.
//! - [`wire`]: wire-level protobuf field editing.
//! - [`error`]: the error type and its mapping to gRPC/TensorFlow codes.

pub mod admin;
pub mod admission;
pub mod checkpoint_guard;
pub mod config;
pub mod ctl;
pub mod error;
pub mod exec;
pub mod executor;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod graph_delta;
pub mod job;
pub mod latency;
pub mod master;
pub mod memory_profile;
pub mod op_policy;
pub mod server;
pub mod session_config;
pub mod sessions;
pub mod state;
pub mod tenant;
pub mod tf;
pub mod tf_env;
pub mod tf_log;
pub mod wire;

/// The scheduler core, shared with the simulator (crate `salus-sched`).
pub use salus_sched as sched;
pub use salus_sched::units;
