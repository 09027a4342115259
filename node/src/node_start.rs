//! Starting a node, for every role: the state directory restored (tokens,
//! job history), the device's memory and lanes, the devices listed, the
//! scheduler core and memory admission built. TensorFlow-free: the caller
//! lists the devices (in this process, or through a child for the
//! supervisor), so the supervisor's binary reaches no TensorFlow code.

use std::future::Future;
use std::sync::Arc;

use crate::config::Config;
use crate::error::Error;
use crate::gpu_probe::{self, GpuProbe};
use crate::runtime::admission::Admission;
use crate::runtime::device_list::DeviceList;
use crate::runtime::executor::Executor;
use crate::runtime::job_history::{load_history, HistorySaver};
use crate::runtime::node::Node;
use crate::runtime::sched_port::SchedPort;
use crate::runtime::session_config::{GpuLanes, SessionDefaults};
use crate::runtime::settings::Settings;
use crate::runtime::timeline::Timeline;
use crate::sched::lanes::LaneManager;
use crate::sched::policy;
use crate::sched::History;
use crate::seam::client::SeamClient;
use crate::state_dir::StateDir;
use crate::tenant::identity::Identifier;
use crate::tenant::tokens::TokenStore;
use crate::tenant::uid_pool::{UidPool, UidRange};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("TensorFlow could not start: {0}")]
    Startup(#[from] Error),
    #[error("gRPC transport failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::StateDirError),
}

/// What this process is: the whole server (`--isolation none`), the
/// supervisor of tenants' executor processes, or one tenant's executor.
#[derive(Clone)]
pub enum Role {
    Single,
    Supervisor,
    Executor {
        seam: Arc<SeamClient>,
        /// The first job id of this executor.
        job_base: u64,
    },
}

/// A started node, with its (final) config.
pub struct NodeStart {
    pub config: Config,
    pub node: Arc<Node>,
    /// The tokens issued before this start (from `--state-dir`), until the
    /// identifier takes them; None: an executor, or no state directory.
    issued: Option<TokenStore>,
    /// The uids of tenants that are no Unix user (kept in the state directory
    /// when there is one).
    pub uid_pool: Arc<UidPool>,
}

impl NodeStart {
    /// Starts the node of a process of `role`; `list_devices` lists the
    /// devices jobs get, from the session defaults the flags give (GPU lanes
    /// included). An executor's scheduling and memory admission are the
    /// supervisor's, over the seam.
    pub async fn begin<L, F>(
        mut config: Config,
        role: &Role,
        list_devices: L,
    ) -> Result<NodeStart, ServeError>
    where
        L: FnOnce(SessionDefaults) -> F,
        F: Future<Output = Result<DeviceList, Error>>,
    {
        // First: a directory another server holds stops this one before
        // TensorFlow loads. An executor keeps no state (its supervisor does).
        let restored = match (role, config.state_dir.clone()) {
            (Role::Executor { .. }, _) => None,
            (_, None) => {
                tracing::warn!(
                    "no state directory (--state-dir, and no home to default to): \
                    tokens issued at run time and the job history are forgotten at a restart"
                );
                None
            }
            (_, Some(dir)) => Some(restore_state(dir, config.tenant_uid_range).await?),
        };
        let uid_pool = match &restored {
            Some(restored) => restored.uid_pool.clone(),
            None => Arc::new(UidPool::in_memory(config.tenant_uid_range)),
        };
        let (gpu, capacity, capacity_source, gpu_lanes) = memory_setup(&mut config, role)?;
        let DeviceList {
            devices,
            tensorflow_version,
        } = list_devices(config.session_defaults).await?;
        for device in &devices {
            tracing::info!(device = %device.name, kind = %device.device_type, memory = device.memory_bytes, "device");
        }
        if let Some(lanes) = gpu_lanes {
            let gpus = devices.iter().filter(|d| d.device_type == "GPU").count();
            if gpus < lanes.count as usize {
                tracing::warn!(
                    lanes = lanes.count,
                    gpus,
                    "TensorFlow sees fewer GPUs than --gpu-lanes: lanes stay fixed memory budgets, \
                     and soft placement runs their ops on the devices that exist"
                );
            }
        }
        let policy =
            policy::by_name(&config.policy).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        tracing::info!(
            policy = policy.name(),
            lane_concurrency = config.sched.lane_concurrency,
            "scheduler"
        );
        let timeline = Arc::new(Timeline::new(config.timeline_capacity));
        let sched = match role {
            Role::Executor { seam, .. } => SchedPort::Seam(seam.clone()),
            _ => {
                let core = Executor::with_timeline(policy, config.sched, timeline);
                core.set_limits_table(config.tenants.limits().clone());
                SchedPort::Local(core)
            }
        };
        let mut settings = None;
        let issued = restored.map(|restored| {
            if let Some(core) = sched.core() {
                core.keep_history(restored.history, Some(restored.saver));
            }
            settings = Some(restored.settings);
            restored.tokens
        });
        // Run-time settings (ctl policy, limits, hints, drain) over the flags'.
        let settings = Arc::new(settings.unwrap_or_default());
        if let Some(core) = sched.core() {
            settings.set_admins(config.admins.clone());
            if !config.loaded.argv.is_empty() {
                settings.set_reloader(crate::reload::reloader(
                    core.clone(),
                    Arc::downgrade(&settings),
                ));
            }
            for note in settings.reconcile(core, crate::reload::configured(&config)) {
                tracing::info!("{note}");
            }
            if let Some(drain) = settings.drain() {
                tracing::warn!(since_unix_s = drain.since_unix_s, by = %drain.by,
                    "this node is drained (salus drain): new jobs are refused until `salus undrain`");
            }
            settings
                .persist_or_warn("the settings restored at start")
                .await;
        }
        let admission = capacity.map(|capacity| {
            let core = match &sched {
                SchedPort::Local(core) => core.clone(),
                SchedPort::Seam(seam) => return Admission::remote(seam.clone()),
            };
            let lanes = match gpu_lanes {
                Some(gpu) => LaneManager::fixed(&vec![gpu.lane_bytes; gpu.count as usize]),
                None => LaneManager::with_rule(capacity, config.lane_rule),
            };
            tracing::info!(
                capacity,
                fixed_lanes = gpu_lanes.map_or(0, |g| g.count),
                lane_rule = %config.lane_rule,
                timeout_s = config.admission_timeout.as_secs(),
                "memory lanes"
            );
            Admission::new(lanes, config.admission_timeout, core)
        });
        let mut node = Node::new(sched, admission, devices, tensorflow_version);
        node.gpu = gpu;
        node.capacity_source = capacity_source;
        node.settings = settings;
        Ok(NodeStart {
            config,
            node: Arc::new(node),
            issued,
            uid_pool,
        })
    }

    /// Who tenants are: the tenants file, and the tokens issued before this
    /// start, whose reservations and limits are held again here, before any
    /// connection is accepted (so no job admitted first can take their memory).
    pub fn identifier(&mut self) -> Arc<Identifier> {
        let identifier = Identifier::new(self.config.auth, self.config.tenants.clone())
            .with_issued(self.issued.take().unwrap_or_default());
        if let Some(holder) = self.node.grant_holder() {
            crate::tenant::grants::hold_restored(&holder, &identifier);
        }
        Arc::new(identifier)
    }
}

/// What the state directory gave back at start.
struct Restored {
    tokens: TokenStore,
    settings: Settings,
    history: Option<History>,
    saver: HistorySaver,
    uid_pool: Arc<UidPool>,
}

/// Opens (and locks) the state directory and restores the issued tokens and
/// the job history, saying what was dropped; off the async runtime (file
/// reads, fsyncs).
async fn restore_state(
    dir: std::path::PathBuf,
    uid_range: UidRange,
) -> Result<Restored, ServeError> {
    let restored = tokio::task::spawn_blocking(move || {
        let dir = Arc::new(StateDir::open(&dir)?);
        tracing::info!(dir = %dir.path().display(), "state directory");
        let history = load_history(&dir);
        let saver = HistorySaver::start(dir.clone()).map_err(|e| {
            Error::Internal(format!("cannot start the job history's saver thread: {e}"))
        })?;
        let settings = Settings::restore(dir.clone());
        let uid_pool = Arc::new(UidPool::restore(uid_range, dir.clone()));
        let (tokens, report) = TokenStore::restore(dir, std::time::SystemTime::now());
        report.log();
        Ok::<_, ServeError>(Restored {
            tokens,
            settings,
            history,
            saver,
            uid_pool,
        })
    })
    .await
    .map_err(|e| Error::Internal(format!("restoring the server's state failed: {e}")))?;
    restored
}

/// GPU 0 from the driver (a `cuda` build), once; an executor given its
/// capacity by the supervisor does not ask (its figures are never shown).
fn probe_gpu(config: &Config, role: &Role) -> GpuProbe {
    if matches!(role, Role::Executor { .. }) && config.memory_capacity.is_some() {
        return GpuProbe::not_asked();
    }
    let probe = GpuProbe::of_gpu0();
    match &probe.memory {
        Ok(memory) => tracing::info!(
            total = memory.total,
            free = memory.free,
            "GPU 0 memory from the CUDA driver"
        ),
        Err(cause) if probe.cuda_build => {
            tracing::info!(%cause, "no GPU memory from the CUDA driver")
        }
        Err(_) => {}
    }
    probe
}

/// What the device's memory is and how jobs share it: GPU 0 as the CUDA
/// driver gives it, the capacity (flag or GPU), and `--gpu-lanes`' fixed lanes,
/// which every session's config (`config.session_defaults`) then carries.
pub fn memory_setup(
    config: &mut Config,
    role: &Role,
) -> Result<
    (
        GpuProbe,
        Option<u64>,
        gpu_probe::CapacitySource,
        Option<GpuLanes>,
    ),
    Error,
> {
    let gpu = probe_gpu(config, role);
    let (capacity, capacity_source) =
        gpu_probe::memory_capacity(config.memory_capacity, config.gpu_lanes, &gpu);
    if capacity.is_none() && gpu.cuda_build {
        tracing::info!(
            "no memory capacity (no --memory-capacity, no GPU): memory admission stays off"
        );
    }
    let gpu_lanes = gpu_lanes(config, capacity)?;
    config.session_defaults.gpu_lanes = gpu_lanes;
    Ok((gpu, capacity, capacity_source, gpu_lanes))
}

/// `--gpu-lanes N`: the capacity split into N equal lanes.
fn gpu_lanes(config: &Config, capacity: Option<u64>) -> Result<Option<GpuLanes>, Error> {
    if config.gpu_lanes == 0 {
        return Ok(None);
    }
    let capacity = capacity.ok_or_else(|| {
        Error::InvalidArgument(
            "--gpu-lanes needs a memory capacity: set --memory-capacity, or run on a GPU \
             with a salus-server built with --features cuda"
                .into(),
        )
    })?;
    let lane_bytes = capacity / u64::from(config.gpu_lanes);
    if lane_bytes < 1 << 20 {
        return Err(Error::InvalidArgument(format!(
            "--gpu-lanes {} leaves lanes of {lane_bytes} bytes from a capacity of {capacity}; \
             a lane needs at least 1 MiB",
            config.gpu_lanes
        )));
    }
    Ok(Some(GpuLanes {
        count: config.gpu_lanes,
        lane_bytes,
    }))
}
