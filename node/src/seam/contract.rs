//! The process contract between the supervisor and an executor it starts: the
//! fds its sockets are on, the environment it reads its tenant and credentials
//! from, and what else of the supervisor's environment it inherits. (The
//! handshake over the seam is `Hello`, in `seam/`.)

/// The environment an executor process reads its tenant and credentials from.
pub mod env {
    pub const TENANT_NAME: &str = "SALUS_EXECUTOR_TENANT";
    /// `uid:N`, `name:NAME` or `anonymous`.
    pub const TENANT_KEY: &str = "SALUS_EXECUTOR_TENANT_KEY";
    /// `UID:GID:G1,G2,...:HOME` when the executor must switch users.
    pub const RUN_AS: &str = "SALUS_EXECUTOR_RUN_AS";
    /// Bytes of data segment (RLIMIT_DATA) the executor may use.
    pub const MEMORY: &str = "SALUS_EXECUTOR_MEMORY";
    /// The first job id of this executor (ids are unique across executors).
    pub const JOB_BASE: &str = "SALUS_EXECUTOR_JOB_BASE";
    /// The tenant's per-job checkpoint base, absolute (the executor's working
    /// directory is its user's home, not the server's).
    pub const CHECKPOINT_BASE: &str = "SALUS_EXECUTOR_CHECKPOINT_BASE";
    /// `--checkpoint-root`, absolute.
    pub const CHECKPOINT_ROOT: &str = "SALUS_EXECUTOR_CHECKPOINT_ROOT";
    /// How this tenant's previous executor died, when it did: what the
    /// tenant's calls naming its lost sessions and contexts are told.
    pub const PREDECESSOR: &str = "SALUS_EXECUTOR_PREDECESSOR";
    /// The secret that proves this executor to a supervisor that adopts it
    /// (`seam::adoption`); read and removed from the environment first thing.
    pub const ADOPT_SECRET: &str = "SALUS_EXECUTOR_ADOPT_SECRET";
    /// The serial of the executor's record in the state directory.
    pub const SERIAL: &str = "SALUS_EXECUTOR_SERIAL";
}

/// Environment variables an executor inherits (besides its own `SALUS_EXECUTOR_*`).
pub const PASSED_ENV: [&str; 6] = [
    "PATH",
    "LANG",
    "TZ",
    "LD_LIBRARY_PATH",
    "RUST_LOG",
    "RUST_BACKTRACE",
];
pub const PASSED_ENV_PREFIXES: [&str; 11] = [
    "SALUS_", "TF_", "LC_", "CUDA_", "NVIDIA_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "XLA_",
];

/// The fds an executor finds its sockets on.
pub const H2_FD: i32 = 3;
pub const SEAM_FD: i32 = 4;
pub const HANDOVER_FD: i32 = 5;
/// The listening socket of the executor's rendezvous (`seam::adoption`): a new
/// supervisor connects to it once the one that started the executor is gone.
pub const ADOPT_FD: i32 = 6;
