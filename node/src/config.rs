//! Command-line flags (each also an environment variable), validated into
//! [`Config`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

use crate::runtime::session_config::SessionDefaults;
use crate::sched::lanes::LaneRule;
use crate::sched::{policy, SchedConfig, Share};
use crate::tenant::identity::{AuthMode, TenantsFile};
use crate::tenant::op_policy::OpPolicy;
use crate::tenant::{absolute, default_checkpoint_base, CheckpointRoot, TenantRules};
pub use crate::units::parse_size;
use crate::units::{format_duration, parse_time_flag, TimeFlag};

/// Protobuf messages cannot exceed 2 GiB.
const PROTOBUF_MAX_BYTES: u64 = 2 << 30;

#[derive(Parser, Debug)]
#[command(
    name = "salus-server",
    version,
    about = "Salus: runs unmodified TensorFlow scripts in one shared server: TF2 eager code, tf.function \
             and Keras 3 over TensorFlow's remote-eager protocol (with the salus-tf adapter: SALUS_SERVER=HOST:PORT), \
             and TF1 graph sessions (tf.compat.v1.Session(\"grpc://HOST:PORT\")) over its master protocol, on one port. \
             Tenants are Unix users (loopback clients) or tokens (SALUS_TOKEN); each tenant's jobs run in an executor \
             process of its own, as that user when the server runs as root (--isolation)."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// A TOML file of these flags under their long names (`policy = "srtf"`,
    /// `lane-hold-limit = 60`, `admins = ["ci-bot"]`). Flags given on the
    /// command line or in their environment variables win over it; a key that
    /// is no flag is an error. `salus reload` or SIGHUP reads it
    /// again and applies what can change live (see the book's operator guide:
    /// Drain, reload and settings that persist).
    #[arg(long, env = "SALUS_CONFIG")]
    pub config: Option<std::path::PathBuf>,

    /// Where these flags came from (filled in by
    /// [`Args::try_parse_with_config_file`]).
    #[arg(skip)]
    pub loaded: crate::config_file::Loaded,

    /// Address to listen on. Port 0 picks a free port; the bound address is
    /// printed on stdout as "salus-server listening on ADDR".
    #[arg(long, env = "SALUS_LISTEN", default_value = "127.0.0.1:5501")]
    pub listen: SocketAddr,

    /// Address of an HTTP listener serving Prometheus metrics at /metrics,
    /// e.g. 127.0.0.1:9551. Port 0 picks a free port; the bound address is
    /// printed on stdout as "salus-server metrics on ADDR". Unset: no metrics
    /// listener (the endpoint has no authentication and shows job names).
    #[arg(long, env = "SALUS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Largest gRPC message received or sent (and largest tensor a feed may
    /// create), e.g. 2GiB, 512MiB, 1000000. At most 2GiB, protobuf's limit.
    #[arg(long, env = "SALUS_MAX_MESSAGE_SIZE", default_value = "2GiB", value_parser = parse_size)]
    pub max_message_size: u64,

    /// Threads per TensorFlow op for sessions whose client leaves it unset (0: TensorFlow picks).
    #[arg(long, env = "SALUS_INTRA_OP_THREADS", default_value_t = 0)]
    pub intra_op_threads: u32,

    /// Ops run concurrently per session when the client leaves it unset (0: TensorFlow picks).
    #[arg(long, env = "SALUS_INTER_OP_THREADS", default_value_t = 0)]
    pub inter_op_threads: u32,

    /// Scheduling policy: fifo, srtf, pack, fair, rr, priority, las, dlas or gittins. Can be
    /// changed at run time with `salus policy NAME`.
    #[arg(long, env = "SALUS_POLICY", default_value = "fair")]
    pub policy: String,

    /// Between whom device time is shared first. tenants: equal device time
    /// between the tenants (users) with work, by weight, and the policy orders
    /// each tenant's own jobs; jobs: the policy orders every job, whoever owns it.
    #[arg(long, env = "SALUS_SHARE", default_value = "tenants", value_parser = parse_share)]
    pub share: Share,

    /// Main iterations in flight per lane (Salus: 1).
    #[arg(long, env = "SALUS_LANE_CONCURRENCY", default_value_t = 1)]
    pub lane_concurrency: usize,

    /// How long the lane waits for the best-ranked job between two of its
    /// iterations before running a worse job (fifo always waits, pack never).
    /// Was --anticipation-us (a bare number still counts as microseconds).
    #[arg(long, env = "SALUS_ANTICIPATION", alias = "anticipation-us", default_value = "2ms",
          value_parser = micros_flag)]
    pub anticipation: TimeFlag,

    /// Repeated runs measured faster than this are brief: they run at once
    /// instead of being scheduled as main iterations, unless a job the policy
    /// ranks ahead has an iteration queued on the lane. Was --cheap-below-us
    /// (a bare number still counts as microseconds).
    #[arg(long, env = "SALUS_CHEAP_BELOW", alias = "cheap-below-us", default_value = "1ms",
          value_parser = micros_flag)]
    pub cheap_below: TimeFlag,

    /// How long without any request a session or eager context lives before it
    /// is closed and its resources freed (a client that vanished without
    /// closing it). An eager context is also closed after the keep-alive its
    /// client asked for, and 3 s after its client's last stream ended. 0
    /// disables.
    #[arg(long, env = "SALUS_IDLE_TIMEOUT", default_value = "1h", value_parser = seconds_flag)]
    pub idle_timeout: TimeFlag,

    /// Memory of the device that jobs share, e.g. 12GiB. When set, every job
    /// gets a memory lane (Salus's rule: sum of persistent + max of per-iteration
    /// memory) before its first main iteration, and waits while memory is short.
    /// Unset: no admission, all jobs share one lane (a build with the `cuda`
    /// feature uses GPU 0's memory when a CUDA driver is found).
    #[arg(long, env = "SALUS_MEMORY_CAPACITY", value_parser = parse_size)]
    pub memory_capacity: Option<u64>,

    /// How a job gets a lane when the free pool cannot hold a new lane of its
    /// need: pack (join a lane that can grow, else merge idle lanes so their
    /// budgets combine, taking at most one lane that runs iterations, else
    /// wait) or salus (join a lane that can grow, else wait). Both open a new
    /// lane while the pool holds one. No effect with --gpu-lanes.
    #[arg(long, env = "SALUS_LANE_RULE", default_value_t = LaneRule::default())]
    pub lane_rule: LaneRule,

    /// Split the memory into this many fixed lanes, each a TensorFlow virtual
    /// GPU (GPU 0 split at start: TensorFlow fixes virtual devices once per
    /// process); a job's graph is placed on its lane's GPU. Sizes: capacity / N,
    /// capacity being --memory-capacity or 95% of GPU 0's free memory (`cuda`
    /// builds). 0: dynamic lanes, no device split. Not verified on a GPU.
    #[arg(long, env = "SALUS_GPU_LANES", default_value_t = 0)]
    pub gpu_lanes: u32,

    /// How long a job may wait for memory before its iteration fails with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SALUS_ADMISSION_TIMEOUT", default_value = "10m", value_parser = seconds_flag)]
    pub admission_timeout: TimeFlag,

    /// Runs of a job measured faster than this execute on the executor thread
    /// itself instead of TensorFlow's inter-op thread pool, saving two thread
    /// switches per run (0 disables). Was --inline-below-us (a bare number
    /// still counts as microseconds).
    #[arg(long, env = "SALUS_INLINE_BELOW", alias = "inline-below-us", default_value = "200us",
          value_parser = micros_flag)]
    pub inline_below: TimeFlag,

    /// Ops to allow although they reach the server's filesystem or processes
    /// (comma separated, e.g. ReadFile,TFRecordDataset). See SECURITY.md.
    #[arg(long, env = "SALUS_ALLOW_OPS", value_delimiter = ',')]
    pub allow_ops: Vec<String>,

    /// Further ops to refuse in every graph (comma separated).
    #[arg(long, env = "SALUS_DENY_OPS", value_delimiter = ',')]
    pub deny_ops: Vec<String>,

    /// Directory that Save/Restore ops of every job may use (shared by all
    /// jobs). Unset: each job gets its own directory,
    /// ./salus-checkpoints/<job name>. Relative checkpoint paths are placed in
    /// the directory; paths outside it fail the step.
    #[arg(long, env = "SALUS_CHECKPOINT_ROOT")]
    pub checkpoint_root: Option<std::path::PathBuf>,

    /// Largest GraphDef one CreateSession/ExtendSession may carry, e.g. 512MiB.
    #[arg(long, env = "SALUS_MAX_GRAPH_BYTES", default_value = "1GiB", value_parser = parse_size)]
    pub max_graph_bytes: u64,

    /// Most tensor handles one eager context (TF2 job) may hold at once;
    /// requests beyond it fail with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SALUS_MAX_CONTEXT_HANDLES", default_value_t = 1_000_000)]
    pub max_context_handles: usize,

    /// Most functions one eager context may have registered at once.
    #[arg(long, env = "SALUS_MAX_CONTEXT_FUNCTIONS", default_value_t = 10_000)]
    pub max_context_functions: usize,

    /// Most sessions and eager contexts open at once (counted together);
    /// CreateSession or CreateContext beyond it fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SALUS_MAX_SESSIONS", default_value_t = 1024)]
    pub max_sessions: usize,

    /// Most connections one Unix user (a loopback client) or one client
    /// address (any other client) may hold open at once; one more is told why
    /// (an HTTP/2 GOAWAY) and closed, so that nobody can take every file
    /// descriptor the server has. A TensorFlow client process holds one or two.
    /// 0: no cap
    #[arg(long, env = "SALUS_MAX_TENANT_CONNECTIONS", default_value_t = 1024)]
    pub max_tenant_connections: usize,

    /// How long in-flight requests get to finish on SIGINT/SIGTERM before the
    /// server closes all sessions and exits.
    #[arg(long, env = "SALUS_SHUTDOWN_GRACE", default_value = "30s", value_parser = seconds_flag)]
    pub shutdown_grace: TimeFlag,

    /// Under --isolation tenant, how long the executors (and their jobs) wait
    /// for a new supervisor after the server's process ends without a full
    /// stop (SIGTERM, SIGKILL, a crash, an upgrade): one started on the same
    /// --state-dir within this adopts them and no job is lost. Past it they end
    /// their jobs with UNAVAILABLE and exit. 0: executors end with the
    /// supervisor. SIGINT stops everything.
    #[arg(long, env = "SALUS_ADOPT_GRACE", default_value = "2m", value_parser = seconds_flag)]
    pub adopt_grace: TimeFlag,

    /// Recent runs (main iterations and cheap runs) the server keeps for the
    /// admin API's timeline (`salus timeline`); the oldest are evicted. 0 keeps none.
    #[arg(long, env = "SALUS_TIMELINE_CAPACITY", default_value_t = crate::runtime::timeline::DEFAULT_CAPACITY)]
    pub timeline_capacity: usize,

    /// Which identities tenants are accepted with: `uid` (a loopback client's
    /// Unix user, looked up once per connection), `token` (a token the client
    /// carries, SALUS_TOKEN in its environment, listed in --tenants-file),
    /// `both` (a token when the client carries one, else its Unix user), or
    /// `off` (every client is one anonymous tenant). A request that cannot be
    /// attributed gets UNAUTHENTICATED saying what to set.
    #[arg(long, env = "SALUS_AUTH", default_value = "both", value_parser = parse_auth)]
    pub auth: AuthMode,

    /// The tenants that may connect with a token, and tenants' limits: one a
    /// line, `NAME SHA256 RUN-AS [LIMIT=VALUE ...]`, where SHA256 is the token's
    /// (`printf %s TOKEN | sha256sum`), RUN-AS a user name, a uid or `-` (a
    /// tenant that is no Unix user), and the limits weight=1..1000 (share of
    /// device time), max-jobs=N (open sessions and contexts), max-priority=P
    /// (higher hints are lowered to it), memory=SIZE (device memory admitted or
    /// waiting, with --memory-capacity). SHA256 `-`: limits only, for a user
    /// (NAME) identified by its uid; `* - - LIMITS`: the defaults. `#` comments.
    #[arg(long, env = "SALUS_TENANTS_FILE")]
    pub tenants_file: Option<std::path::PathBuf>,

    /// Tenants (Unix user names, or token tenants' names) who may act on the
    /// whole server through the admin API: see every tenant's jobs and
    /// timeline, change any job's hints, change the policy, tenants' limits and tokens. The server's own
    /// user and root always may; every other tenant sees and changes only its
    /// own jobs. Under --auth off everyone is one tenant and an admin.
    #[arg(long, env = "SALUS_ADMINS", value_delimiter = ',')]
    pub admins: Vec<String>,

    /// How tenants are kept apart: `tenant` runs each tenant's jobs in an
    /// executor process of its own (as its Unix user when the server runs as
    /// root), so a crash or a runaway ends only that tenant's jobs, under a
    /// supervisor without TensorFlow (this process execs salus-supervisor,
    /// installed beside it); `none` runs every job in this process (one
    /// trusted user; the most sharing).
    #[arg(long, env = "SALUS_ISOLATION", default_value = "tenant", value_enum)]
    pub isolation: Isolation,

    /// Memory limit of each tenant's executor process (its data segment,
    /// RLIMIT_DATA), e.g. 16GiB: an allocation beyond it fails in that
    /// tenant's executor only (TensorFlow reports RESOURCE_EXHAUSTED, or aborts,
    /// which ends that executor). Unset: no limit. Needs --isolation tenant.
    #[arg(long, env = "SALUS_EXECUTOR_MEMORY_LIMIT", value_parser = parse_size)]
    pub executor_memory: Option<u64>,

    /// Freed memory blocks of 1 MiB and more each server process keeps for the
    /// next allocation of about their size, e.g. 512MiB, 0 (off): glibc would
    /// unmap a step's large activations and the next step would page-fault
    /// them in again (3-11% slower CNN steps measured). Given back when a
    /// session or eager context ends, and before an allocation is refused.
    #[arg(long, env = "SALUS_BLOCK_CACHE", default_value = "512MiB", value_parser = parse_size)]
    pub block_cache: u64,

    /// How long a main iteration may hold its lane (--isolation tenant): past
    /// it, the scheduler starts other jobs' iterations beside it (it runs on,
    /// charged the limit as device time) and counts it in `lane_holds_released`, so an
    /// iteration that blocks (a dequeue from a queue nobody fills, a hung
    /// input pipeline) cannot stop other tenants' jobs. 0: no limit.
    #[arg(long, env = "SALUS_LANE_HOLD_LIMIT", default_value = "60s", value_parser = seconds_flag)]
    pub lane_hold_limit: TimeFlag,

    /// How long an executor that holds a lane (--isolation tenant) may leave
    /// the supervisor's ping unanswered: past it (the executor stopped,
    /// frozen, or not reading its seam), its lanes go to other jobs and its
    /// iterations wait until it is heard again. This is the most a tenant's
    /// executor can cost other tenants (a SIGSTOP of an executor the
    /// supervisor started is seen at once). 0: no pings.
    #[arg(long, env = "SALUS_SILENCE_LIMIT", default_value = "1s", value_parser = seconds_flag)]
    pub silence_limit: TimeFlag,

    /// How long an executor process with no open job and no request lives on
    /// before it is stopped (its tenant's next request starts a new one).
    #[arg(long, env = "SALUS_EXECUTOR_IDLE_TIMEOUT", default_value = "60s", value_parser = seconds_flag)]
    pub executor_idle_timeout: TimeFlag,

    /// Bytes per second of each executor's output (what its TensorFlow and the
    /// tenant's ops such as tf.print write to stderr) copied into the server's
    /// log, after a burst of 16 s of it, e.g. 64KiB; lines beyond it are
    /// dropped and counted in a note, so a tenant printing without end cannot
    /// fill the log or slow the server. An executor's last lines still explain
    /// its death. 0: copy everything.
    #[arg(long, env = "SALUS_EXECUTOR_LOG_RATE", default_value = "64KiB", value_parser = parse_size)]
    pub executor_log_rate: u64,

    /// Uids (FIRST-LAST) for the executors of tenants that are no Unix user
    /// (token tenants whose user is `-`), when the server runs as root: each
    /// such tenant gets one of its own (its gid the same number, no other
    /// groups), so no two share a uid and none can signal or trace
    /// another's executor. A tenant keeps its uid across restarts (kept in
    /// --state-dir); uids and gids the user and group databases know are
    /// skipped. A new tenant is refused when the range is used up.
    #[arg(long, env = "SALUS_TENANT_UID_RANGE", default_value = crate::tenant::uid_pool::DEFAULT_RANGE,
          value_parser = crate::tenant::uid_pool::UidRange::parse)]
    pub tenant_uid_range: crate::tenant::uid_pool::UidRange,

    /// Directory for what outlives a restart: the tokens issued at run time
    /// (their SHA-256, never the tokens), with their tenants, limits, memory
    /// reservations and expiry, so that jobs placed before a restart are
    /// accepted after it and their reservations are held again before any new
    /// job is admitted; the job history; the uids of token tenants without a
    /// Unix user (--tenant-uid-range); the policy, limits, hints and drain
    /// set at run time (`ctl`). Created 0700 if missing; files 0600. One server per
    /// directory (it is locked). Default: /var/lib/salus/state as root, else
    /// $XDG_STATE_HOME/salus or ~/.local/state/salus.
    #[arg(long, env = "SALUS_STATE_DIR")]
    pub state_dir: Option<std::path::PathBuf>,

    /// More output: -v adds TensorFlow's own logs and debug logs, -vv trace logs.
    /// RUST_LOG overrides the log filter.
    #[arg(short, long, env = "SALUS_VERBOSE", action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// The log's format: text (one line per event) or json (one JSON object
    /// per line: timestamp, level, target, fields; an executor's lines carry
    /// "executor": "TENANT:PID").
    #[arg(long, env = "SALUS_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

impl Args {
    /// The process's flags ([`std::env::args_os`]), with `--config`'s file merged.
    pub fn try_parse_with_config_file() -> Result<Args, clap::Error> {
        adopt_renamed_env();
        Args::try_parse_from_with_config_file(std::env::args_os().collect())
    }

    /// `argv`'s flags (argv[0] first), with `--config`'s file merged
    /// ([`crate::config_file`]): the command line and the environment win over
    /// the file, the file over the defaults.
    pub fn try_parse_from_with_config_file(
        argv: Vec<std::ffi::OsString>,
    ) -> Result<Args, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let (matches, loaded) = crate::config_file::matches_with_file(Args::command(), argv)?;
        let mut args = Args::from_arg_matches(&matches)?;
        args.loaded = loaded;
        Ok(args)
    }
}

/// How tenants are kept apart (`--isolation`; its text and config key are
/// `tenant` and `none`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    // Plain comments, not doc comments: clap would list those in --help
    // and change the reference pages. Each tenant's jobs in an executor
    // process of its own, under a supervisor without TensorFlow.
    #[value(name = "tenant")]
    Tenant,
    // Every job in this one process.
    #[value(name = "none")]
    SharedProcess,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Deprecated: the `salus` command (same commands: jobs, stats, policy, hints, limits, tokens, drain, ...).
    /// `salus-server ctl ARGS` runs `salus ARGS` after a warning; removed in the next release.
    // --help goes on to `salus`, which lists the commands.
    #[command(disable_help_flag = true)]
    Ctl {
        /// What `salus` takes: a command and its options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// A tenant's executor process: started by the server itself, not by users.
    #[command(hide = true)]
    Executor,
    /// Lists the devices jobs get from these flags as one JSON line, and exits:
    /// run by the supervisor, which runs no TensorFlow itself.
    #[command(hide = true, name = "probe-devices")]
    ProbeDevices,
}

/// Validated settings of one server.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listener; None: off.
    pub metrics_listen: Option<SocketAddr>,
    pub max_message_size: usize,
    pub session_defaults: SessionDefaults,
    pub inline_below: Duration,
    pub cheap_below: Duration,
    pub memory_capacity: Option<u64>,
    /// Dynamic lanes' rule when memory is short.
    pub lane_rule: LaneRule,
    /// Fixed GPU lanes (0: dynamic lanes).
    pub gpu_lanes: u32,
    pub admission_timeout: Duration,
    pub policy: String,
    pub sched: SchedConfig,
    /// None: sessions are never reclaimed for idleness.
    pub idle_timeout: Option<Duration>,
    pub shutdown_grace: Duration,
    /// `--adopt-grace`; zero: executors end with their supervisor.
    pub adopt_grace: Duration,
    pub verbose: u8,
    /// `--log-format json`.
    pub log_json: bool,
    /// Old spellings the flags were given in, as warnings to log once logging runs.
    pub deprecations: Vec<String>,
    /// What jobs' graphs may do (ops, checkpoint directory, graph size).
    pub tenant: TenantRules,
    pub max_sessions: usize,
    /// Connections one user or client address may hold open; 0: no cap.
    pub max_tenant_connections: usize,
    /// Spans the run timeline keeps.
    pub timeline_capacity: usize,
    /// Which identities are accepted, and the tenants with tokens.
    pub auth: AuthMode,
    pub tenants: TenantsFile,
    /// Who may act on the whole server through the admin API.
    pub admins: crate::tenant::admins::Admins,
    /// One executor process per tenant (true) or one process for all.
    pub isolate_tenants: bool,
    pub executor_memory: Option<u64>,
    pub executor_idle_timeout: Duration,
    /// Bytes per second of an executor's output copied into the log; None: all.
    pub executor_log_rate: Option<u64>,
    /// `--tenant-uid-range`: the uids of tenants that are no Unix user.
    pub tenant_uid_range: crate::tenant::uid_pool::UidRange,
    /// How long a tenant's main iteration may hold its lane; None: no limit.
    pub lane_hold_limit: Option<Duration>,
    /// How long an executor holding a lane may leave a ping unanswered; None: no pings.
    pub silence_limit: Option<Duration>,
    /// Bytes of freed large blocks kept for reuse (`block_cache`).
    pub block_cache_bytes: usize,
    /// Where issued tokens are saved (`--state-dir` or its default); None: in
    /// memory only (an executor process, or no home directory to default to).
    pub state_dir: Option<std::path::PathBuf>,
    /// The flags' sources (`--config`, the argv), for a reload.
    pub loaded: crate::config_file::Loaded,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 5501)),
            metrics_listen: None,
            max_message_size: PROTOBUF_MAX_BYTES as usize,
            session_defaults: SessionDefaults::default(),
            inline_below: Duration::from_micros(200),
            cheap_below: Duration::from_micros(1000),
            memory_capacity: None,
            lane_rule: LaneRule::default(),
            gpu_lanes: 0,
            admission_timeout: Duration::from_secs(600),
            policy: "fair".into(),
            sched: SchedConfig::default(),
            idle_timeout: Some(Duration::from_secs(3600)),
            shutdown_grace: Duration::from_secs(30),
            adopt_grace: Duration::from_secs(120),
            verbose: 0,
            log_json: false,
            deprecations: Vec::new(),
            tenant: TenantRules::default(),
            max_sessions: 1024,
            max_tenant_connections: 1024,
            timeline_capacity: crate::runtime::timeline::DEFAULT_CAPACITY,
            auth: AuthMode::Both,
            tenants: TenantsFile::default(),
            admins: crate::tenant::admins::Admins::default(),
            isolate_tenants: true,
            executor_memory: None,
            executor_idle_timeout: Duration::from_secs(60),
            executor_log_rate: Some(64 << 10),
            tenant_uid_range: Default::default(),
            lane_hold_limit: Some(Duration::from_secs(60)),
            silence_limit: Some(Duration::from_secs(1)),
            block_cache_bytes: crate::block_cache::DEFAULT_MAX_BYTES,
            state_dir: None,
            loaded: Default::default(),
        }
    }
}

impl TryFrom<Args> for Config {
    type Error = String;

    fn try_from(args: Args) -> Result<Config, String> {
        if args.max_message_size == 0 || args.max_message_size > PROTOBUF_MAX_BYTES {
            return Err(format!(
                "--max-message-size must be between 1 byte and 2GiB, got {} bytes",
                args.max_message_size
            ));
        }
        policy::by_name(&args.policy).map_err(|e| e.to_string())?;
        if args.gpu_lanes > 0 && args.memory_capacity.is_none() && !cfg!(feature = "cuda") {
            return Err(
                "--gpu-lanes needs --memory-capacity, or a salus-server built with --features cuda \
                 to read GPU memory from the driver"
                    .into(),
            );
        }
        if args.max_sessions == 0 {
            return Err("--max-sessions must be at least 1".into());
        }
        if let Some(op) = args
            .allow_ops
            .iter()
            .chain(&args.deny_ops)
            .find(|op| op.is_empty() || op.contains(char::is_whitespace))
        {
            return Err(format!("--allow-ops/--deny-ops: {op:?} is not an op name"));
        }
        // An executor process serves one tenant the supervisor identified:
        // it neither reads the tenants file nor could (it runs as the tenant).
        // A device probe needs neither those nor the state directory.
        let executor = matches!(
            args.command,
            Some(Command::Executor | Command::ProbeDevices)
        );
        let tenants = match &args.tenants_file {
            Some(path) if !executor => TenantsFile::load(path)?,
            _ => TenantsFile::default(),
        };
        if args.auth == AuthMode::Token && tenants.is_empty() && !executor {
            return Err(
                "--auth token needs --tenants-file listing at least one tenant's token".into(),
            );
        }
        if args.executor_memory.is_some() && args.isolation == Isolation::SharedProcess {
            return Err("--executor-memory needs --isolation tenant (there are no executor processes with none)".into());
        }
        if args
            .state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err("--state-dir must name a directory".into());
        }
        // The supervisor keeps the state; an executor (run as its tenant) neither may nor needs to.
        let state_dir = match (&args.state_dir, executor) {
            (_, true) => None,
            (Some(dir), false) => Some(absolute(dir)),
            (None, false) => crate::state_dir::default_state_dir(),
        };
        if args.lane_concurrency == 0 {
            return Err("--lane-concurrency must be at least 1".into());
        }
        Ok(Config {
            listen: args.listen,
            metrics_listen: args.metrics_listen,
            max_message_size: args.max_message_size as usize,
            session_defaults: SessionDefaults {
                intra_op_threads: args.intra_op_threads,
                inter_op_threads: args.inter_op_threads,
                // Sized at start, once the capacity is known.
                gpu_lanes: None,
            },
            // Said once, by the process the operator started (its children get the same flags).
            deprecations: if executor {
                Vec::new()
            } else {
                deprecations(&args)
            },
            inline_below: args.inline_below.value,
            cheap_below: args.cheap_below.value,
            memory_capacity: args.memory_capacity,
            lane_rule: args.lane_rule,
            gpu_lanes: args.gpu_lanes,
            admission_timeout: args.admission_timeout.value,
            policy: args.policy,
            sched: SchedConfig {
                lane_concurrency: args.lane_concurrency,
                anticipation: u64::try_from(args.anticipation.value.as_nanos()).unwrap_or(u64::MAX),
                share: args.share,
            },
            idle_timeout: args.idle_timeout.nonzero(),
            shutdown_grace: args.shutdown_grace.value,
            adopt_grace: args.adopt_grace.value,
            verbose: args.verbose,
            log_json: args.log_format == "json",
            tenant: TenantRules {
                ops: OpPolicy::new(&args.allow_ops, &args.deny_ops),
                checkpoints: match &args.checkpoint_root {
                    Some(dir) => CheckpointRoot::Shared(absolute(dir)),
                    None => CheckpointRoot::PerJob(default_checkpoint_base()),
                },
                max_graph_bytes: args.max_graph_bytes,
                max_context_handles: args.max_context_handles,
                max_context_functions: args.max_context_functions,
                confined: true,
            },
            max_sessions: args.max_sessions,
            max_tenant_connections: args.max_tenant_connections,
            timeline_capacity: args.timeline_capacity,
            auth: args.auth,
            tenants,
            admins: crate::tenant::admins::Admins::new(args.admins.clone()),
            isolate_tenants: args.isolation == Isolation::Tenant,
            executor_memory: args.executor_memory,
            executor_idle_timeout: args.executor_idle_timeout.value,
            executor_log_rate: (args.executor_log_rate > 0).then_some(args.executor_log_rate),
            tenant_uid_range: args.tenant_uid_range,
            lane_hold_limit: args.lane_hold_limit.nonzero(),
            silence_limit: args.silence_limit.nonzero(),
            block_cache_bytes: usize::try_from(args.block_cache).unwrap_or(usize::MAX),
            state_dir,
            loaded: args.loaded,
        })
    }
}

/// The longest a time flag takes: a bound, so that a typo cannot overflow a deadline.
const MAX_TIME_FLAG: Duration = Duration::from_secs(366 * 86_400);

/// A time flag whose bare numbers were microseconds (`--anticipation-us 2000`).
fn micros_flag(text: &str) -> Result<TimeFlag, String> {
    within_a_year(text, parse_time_flag(text, Some(Duration::from_micros(1)))?)
}

/// A time flag whose bare numbers were seconds (`--idle-timeout 3600`).
fn seconds_flag(text: &str) -> Result<TimeFlag, String> {
    within_a_year(text, parse_time_flag(text, Some(Duration::from_secs(1)))?)
}

fn within_a_year(text: &str, flag: TimeFlag) -> Result<TimeFlag, String> {
    if flag.value > MAX_TIME_FLAG {
        return Err(format!("{text:?} is longer than a year"));
    }
    Ok(flag)
}

/// Environment variables renamed with their flags: (old, new).
pub const RENAMED_ENV: [(&str, &str); 3] = [
    ("SALUS_ANTICIPATION_US", "SALUS_ANTICIPATION"),
    ("SALUS_CHEAP_BELOW_US", "SALUS_CHEAP_BELOW"),
    ("SALUS_INLINE_BELOW_US", "SALUS_INLINE_BELOW"),
];

/// A renamed variable set under its old name only counts under its new one
/// (clap reads one name per flag). Runs before the process starts threads;
/// the children it starts inherit the new name.
fn adopt_renamed_env() {
    for (old, new) in RENAMED_ENV {
        if let (Some(value), None) = (std::env::var_os(old), std::env::var_os(new)) {
            std::env::set_var(new, value);
        }
    }
}

/// Old spellings these flags still accept, each as a warning to log: a time
/// written as a bare number, a renamed environment variable.
fn deprecations(args: &Args) -> Vec<String> {
    let times = [
        ("anticipation", args.anticipation),
        ("cheap-below", args.cheap_below),
        ("inline-below", args.inline_below),
        ("idle-timeout", args.idle_timeout),
        ("admission-timeout", args.admission_timeout),
        ("shutdown-grace", args.shutdown_grace),
        ("adopt-grace", args.adopt_grace),
        ("lane-hold-limit", args.lane_hold_limit),
        ("silence-limit", args.silence_limit),
        ("executor-idle-timeout", args.executor_idle_timeout),
    ];
    let mut notes: Vec<String> = times
        .iter()
        .filter(|(_, flag)| flag.bare)
        .map(|(name, flag)| {
            format!(
                "--{name} was given a bare number, read as {}: write the unit (--{name} {}); bare numbers will be refused in a later release",
                format_duration(flag.value),
                format_duration(flag.value)
            )
        })
        .collect();
    notes.extend(RENAMED_ENV.iter().filter(|(old, _)| std::env::var_os(old).is_some()).map(|(old, new)| {
        format!("{old} is read as {new}, its new name: rename it; the old name will be ignored in a later release")
    }));
    notes
}

fn parse_share(text: &str) -> Result<Share, String> {
    text.parse()
        .map_err(|e: crate::sched::tenants::UnknownShare| e.to_string())
}

fn parse_auth(text: &str) -> Result<AuthMode, String> {
    AuthMode::parse(text).ok_or_else(|| {
        format!(
            "unknown --auth {text:?}: choose one of {}",
            AuthMode::NAMES.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_loopback() {
        let config = Config::try_from(Args::parse_from(["salus-server"])).unwrap();
        assert!(config.listen.ip().is_loopback());
        assert_eq!(config.listen.port(), 5501);
        assert!(config.max_message_size >= 1 << 30);
        assert_eq!(config.metrics_listen, None);
        let config = Config::try_from(Args::parse_from([
            "salus-server",
            "--metrics-listen",
            "127.0.0.1:0",
        ]))
        .unwrap();
        assert_eq!(
            config.metrics_listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
    }

    #[test]
    fn time_flags_take_units_and_still_read_the_old_forms_with_a_warning() {
        let config = Config::try_from(Args::parse_from([
            "salus-server",
            "--anticipation",
            "5ms",
            "--idle-timeout",
            "2h",
            "--silence-limit",
            "250ms",
            "--lane-hold-limit",
            "0",
        ]))
        .unwrap();
        assert_eq!(config.sched.anticipation, 5_000_000);
        assert_eq!(config.idle_timeout, Some(Duration::from_secs(7200)));
        assert_eq!(config.silence_limit, Some(Duration::from_millis(250)));
        assert_eq!(config.lane_hold_limit, None, "0 is off and needs no unit");
        assert!(config.deprecations.is_empty(), "{:?}", config.deprecations);

        let defaults = Config::try_from(Args::parse_from(["salus-server"])).unwrap();
        let built_in = Config::default();
        assert_eq!(defaults.sched.anticipation, 2_000_000);
        assert_eq!(defaults.cheap_below, Duration::from_millis(1));
        assert_eq!(defaults.inline_below, Duration::from_micros(200));
        assert_eq!(defaults.admission_timeout, built_in.admission_timeout);
        assert_eq!(defaults.idle_timeout, built_in.idle_timeout);
        assert_eq!(defaults.adopt_grace, built_in.adopt_grace);
        assert_eq!(defaults.silence_limit, built_in.silence_limit);
        assert!(defaults.deprecations.is_empty());

        // The old flag name, and bare numbers in each flag's old unit.
        let old = Config::try_from(Args::parse_from([
            "salus-server",
            "--anticipation-us",
            "1500",
            "--idle-timeout",
            "30",
        ]))
        .unwrap();
        assert_eq!(old.sched.anticipation, 1_500_000);
        assert_eq!(old.idle_timeout, Some(Duration::from_secs(30)));
        assert_eq!(old.deprecations.len(), 2, "{:?}", old.deprecations);
        assert!(
            old.deprecations[0].contains("--anticipation 1500us"),
            "{:?}",
            old.deprecations
        );
        assert!(
            old.deprecations[1].contains("--idle-timeout 30s"),
            "{:?}",
            old.deprecations
        );

        let err =
            Args::try_parse_from(["salus-server", "--adopt-grace", "2 fortnights"]).unwrap_err();
        assert!(err.to_string().contains("unknown unit"), "{err}");
        let err = Args::try_parse_from(["salus-server", "--idle-timeout", "400d"]).unwrap_err();
        assert!(err.to_string().contains("longer than a year"), "{err}");
    }

    #[test]
    fn rejects_unknown_policies_and_zero_concurrency() {
        let err =
            Config::try_from(Args::parse_from(["salus-server", "--policy", "bogus"])).unwrap_err();
        assert!(
            err.contains("fifo, srtf, pack, fair, rr, priority, las"),
            "{err}"
        );
        let err = Config::try_from(Args::parse_from([
            "salus-server",
            "--lane-concurrency",
            "0",
        ]))
        .unwrap_err();
        assert!(err.contains("at least 1"), "{err}");
        let config =
            Config::try_from(Args::parse_from(["salus-server", "--idle-timeout", "0"])).unwrap();
        assert_eq!(config.idle_timeout, None);
        assert_eq!(config.policy, "fair");
        assert_eq!(config.lane_rule, LaneRule::Pack);
        let config =
            Config::try_from(Args::parse_from(["salus-server", "--lane-rule", "salus"])).unwrap();
        assert_eq!(config.lane_rule, LaneRule::Salus);
        let err = Args::try_parse_from(["salus-server", "--lane-rule", "best"]).unwrap_err();
        assert!(err.to_string().contains("salus or pack"), "{err}");
    }

    #[test]
    fn the_state_dir_is_absolute_and_an_executor_keeps_none() {
        let config = Config::try_from(Args::parse_from([
            "salus-server",
            "--state-dir",
            "rel/state",
        ]))
        .unwrap();
        let dir = config.state_dir.unwrap();
        assert!(dir.is_absolute() && dir.ends_with("rel/state"), "{dir:?}");
        let executor = Config::try_from(Args::parse_from([
            "salus-server",
            "--state-dir",
            "/x",
            "executor",
        ]))
        .unwrap();
        assert_eq!(executor.state_dir, None);
        assert!(Args::try_parse_from(["salus-server", "--state-dir", ""]).is_err());
    }

    #[test]
    fn rejects_oversized_messages() {
        let args = Args::parse_from(["salus-server", "--max-message-size", "3GiB"]);
        assert!(Config::try_from(args).unwrap_err().contains("2GiB"));
    }
}
