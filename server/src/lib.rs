//! # salus-server
//!
//! One process that runs many TensorFlow jobs. Stock TensorFlow clients speak
//! TensorFlow's own protocols: TF2 eager clients the remote-eager protocol (one
//! eager context per job, executed in a TFE context), TF1 graph sessions the
//! master protocol (one TF_Session per job); the server executes both through
//! TensorFlow's C API.
//!
//! # Layout
//! The folders follow the architecture: protocol front ends on top, one job
//! runtime under them, the tenant boundary and the TensorFlow bindings below.
//! - [`config`]: command-line flags and the validated [`config::Config`];
//!   [`config_file`]: `--config FILE` (the flags as TOML keys) merged under them.
//! - [`reload`]: `salus reload` and SIGHUP, the flags, config and tenants files
//!   read again; [`runtime::settings`]: what admins change at run time
//!   (policy, limits, hints, drain), kept in the state directory.
//! - [`node_start`]: every role's start ([`node_start::Role`]: the whole server,
//!   the supervisor, a tenant's executor), TensorFlow-free; [`runtime::node`]
//!   is what it gives.
//! - [`server`]: assembles the gRPC services of a process that runs jobs and
//!   runs them until shutdown.
//! - [`process`]: what the two binaries (`main.rs`: `salus-server`; crate
//!   salus-supervisor: `salus-supervisor`, which cannot link TensorFlow) do
//!   as processes.
//! - Crate salus-node holds every module of this list that needs no
//!   TensorFlow (config, reload, node_start, process, error, the admin front
//!   end and `/metrics`, the runtime's scheduler port, core, admission and
//!   rows, tenant but its checkpoint guard, seam, supervisor, the leaves);
//!   they are re-exported here under the same paths.
//! - [`frontend::identify`]: each request's tenant, from its connection and headers.
//! - [`frontend`]: the gRPC services; they translate requests and call the runtime.
//!   - [`frontend::master`]: `tensorflow.MasterService`, one handler per RPC.
//!   - [`frontend::eager`]: `tensorflow.eager.EagerService` and the
//!     `tensorflow.WorkerService` methods eager clients call.
//!   - [`frontend::admin`]: `salus.v1.Admin`, the server's own status API.
//!   - [`frontend::metrics`]: Prometheus `/metrics` over HTTP (`--metrics-listen`), a
//!     view of the admin API's messages.
//! - [`runtime`]: jobs and how they run.
//!   - [`runtime::state`], [`runtime::jobs`], [`runtime::graph_job`]: shared
//!     state, the tables of jobs, one TF_Session job.
//!   - [`runtime::eager_job`], [`runtime::rendezvous`], [`runtime::eager_devices`]:
//!     one TFE context job, the tensors its `_Send`s hand to RecvTensor, and
//!     its device names.
//!   - [`runtime::graph_delta`]: checks (delta) GraphDefs before import.
//!   - [`runtime::session_config`]: client ConfigProto -> server-side session config.
//!   - [`runtime::sched_port`]: the jobs' one way to the scheduler core, in
//!     memory or over the seam; [`runtime::executor`]: the core, driven with
//!     real time by lane threads.
//!   - [`runtime::job_source`]: the admin API's jobs: this process's
//!     ([`runtime::local_jobs`]: a TensorFlow job's row, `ServerState` as a
//!     source), or the executors' reports.
//!   - [`runtime::timeline`]: the bounded ring of recent runs per lane
//!     (served by [`frontend::timeline`], drawn by `salus timeline`).
//!   - [`runtime::admission`]: memory lanes for jobs, waiting, RAII reservations.
//!   - [`runtime::memory_profile`]: a run's memory peak from TF's step stats.
//!   - [`runtime::latency`]: latency statistics (switch latency, iteration time, queue wait).
//!   - [`runtime::run_stats`], [`runtime::run_errors`]: iteration histograms and cheap runs
//!     per job; failed runs by TensorFlow code.
//!   - [`runtime::exec`]: runs TensorFlow work off the async runtime.
//! - [`tenant`]: who a tenant is and what its jobs may do: [`tenant::identity`]
//!   (`--auth`, tokens, the tenants file), [`tenant::grants`] (what issued tokens
//!   grant, applied; the sweep of expired ones), [`tenant::peer_uid`] (the Unix user of
//!   a loopback client, from the kernel's sock_diag), [`tenant::users`] (passwd
//!   lookups); [`tenant::op_policy`] (refused ops) and [`tenant::checkpoint_guard`]
//!   (checkpoint paths confined to the job's directory) for tenants whose
//!   computation runs with permissions not their own.
//! - Processes (`--isolation tenant`): [`supervisor`] (the process users start:
//!   identity, the one scheduler core and admission, admin; relays each tenant's
//!   calls to its executor), [`executor`] (one tenant's process: front ends,
//!   runtime and TensorFlow, as that tenant's user), [`seam`] (the protocol
//!   between them). `--isolation none` runs front ends and runtime in one process.
//! - [`sched`] (crate `salus-sched`): the scheduler core and memory lanes.
//! - [`tf`]: safe wrappers over TensorFlow's C API.
//! - `gpu` (feature `cuda`): GPU memory from the CUDA driver, loaded at run time.
//! - [`state_dir`]: what outlives the process (`--state-dir`): issued tokens,
//!   each kind of state a versioned file written atomically.
//! - `salus-server ctl ...`: forwarded to the `salus` CLI (the salus-cli crate), deprecated.
//! - [`reference`]: the book's generated reference pages (flags, config keys,
//!   metrics) and the test that keeps them current.
//! - [`tf_log`]: filters TensorFlow's own log lines out of stderr.
//! - [`tf_env`]: TensorFlow settings chosen through the environment.
//! - [`heap_meter`]: the heap a stretch of work takes (eager jobs' memory),
//!   counted by the binary's `malloc` hooks (`malloc_hooks.rs`).
//! - [`block_cache`]: large freed blocks kept for reuse by those hooks, so a
//!   step's activations do not cost fresh page faults every iteration.
//! - [`wire`]: wire-level protobuf field editing (a leaf, as [`http2`] and [`sync`]).
//! - [`sync`]: a lock that survives a panic elsewhere.
//! - [`http2`]: the HTTP/2 bytes the supervisor speaks itself (preface, SETTINGS,
//!   GOAWAY) and every server's flow-control windows.
//! - [`error`]: the error type and its mapping to gRPC/TensorFlow codes.

pub mod executor;
pub mod frontend;
pub mod reference;
pub mod runtime;
pub mod server;
pub mod tenant;
pub mod tf;

// What a node shares without TensorFlow (crate salus-node, from which the
// supervisor is built), under the same paths: `crate::config`, `crate::seam`
// and the rest resolve here as before. `runtime`, `tenant` and `frontend` are
// this crate's, and re-export salus-node's parts of them.
#[cfg(feature = "cuda")]
pub use salus_node::gpu;
pub use salus_node::{
    block_cache, config, config_file, error, gpu_probe, heap_meter, http2, listen_fds, log_json, node_start,
    process, reload, seam, state_dir, supervisor, sync, tf_env, tf_log, tf_types, wire,
};

/// The scheduler core, shared with the simulator (crate `salus-sched`).
pub use salus_sched as sched;
pub use salus_sched::units;
