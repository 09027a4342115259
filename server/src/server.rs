//! Assembles the gRPC server: master service (TF1 graph sessions), eager and
//! worker services (TF2 remote eager), admin service and health, on one
//! listener, with graceful shutdown.

use std::future::Future;
use std::sync::Arc;

use salus_proto::salus::v1::admin_server::AdminServer;
use salus_proto::salus::v1::python_callbacks_server::PythonCallbacksServer;
use salus_proto::tensorflow::eager::eager_service_server::EagerServiceServer;
use salus_proto::tensorflow::master_service_server::MasterServiceServer;
use salus_proto::tensorflow::worker_service_server::WorkerServiceServer;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::error::Error;
use crate::frontend::admin::AdminService;
use crate::frontend::eager::{Eager, Worker};
use crate::frontend::identify::{identified_incoming, IdentifyLayer};
use crate::http2::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};
use crate::runtime::job_history::{load_history, HistorySaver};
use crate::state_dir::StateDir;
use crate::tenant::identity::Identifier;
use crate::tenant::tokens::TokenStore;
use crate::tenant::connections::ConnectionCounts;
use crate::frontend::master::Master;
use crate::gpu_probe::{self, GpuProbe};
use crate::runtime::admission::Admission;
use crate::runtime::device_list::{self, DeviceList};
use crate::runtime::exec;
use crate::runtime::executor::Executor;
use crate::runtime::graph_job::JobSettings;
use crate::runtime::session_config::GpuLanes;
use crate::runtime::state::ServerState;
use crate::runtime::timeline::Timeline;
use crate::seam::client::SeamClient;
use crate::sched::lanes::LaneManager;
use crate::sched::policy;
use crate::sched::{History, RunEnd};

/// What the state directory gave back at start.
struct Restored {
    tokens: TokenStore,
    history: Option<History>,
    saver: HistorySaver,
}

/// Opens (and locks) the state directory and restores the issued tokens and
/// the job history, saying what was dropped; off the async runtime (file
/// reads, fsyncs).
async fn restore_state(dir: std::path::PathBuf) -> Result<Restored, ServeError> {
    let restored = tokio::task::spawn_blocking(move || {
        let dir = Arc::new(StateDir::open(&dir)?);
        tracing::info!(dir = %dir.path().display(), "state directory");
        let history = load_history(&dir);
        let saver = HistorySaver::start(dir.clone()).map_err(|e| {
            Error::Internal(format!("cannot start the job history's saver thread: {e}"))
        })?;
        let (tokens, report) = TokenStore::restore(dir, std::time::SystemTime::now());
        report.log();
        Ok::<_, ServeError>(Restored {
            tokens,
            history,
            saver,
        })
    })
    .await
    .map_err(|e| Error::Internal(format!("restoring the server's state failed: {e}")))?;
    restored
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("TensorFlow could not start: {0}")]
    Startup(#[from] Error),
    #[error("gRPC transport failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::StateDirError),
}


/// A connection the gRPC server can serve: a TCP client's, or in an executor
/// one handed over by the supervisor or the supervisor's relay.
pub trait ServedConnection:
    tonic::transport::server::Connected + tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
}

impl<T> ServedConnection for T where
    T: tonic::transport::server::Connected + tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static
{
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

/// A started server: TensorFlow initialised, devices known.
pub struct Server {
    config: Config,
    state: Arc<ServerState>,
    /// The tokens issued before this start (from `--state-dir`), until the
    /// identifier takes them; None: an executor, or no state directory.
    issued: Option<TokenStore>,
}

impl Server {
    /// Initialises TensorFlow and lists the devices every session will see.
    pub async fn start(config: Config) -> Result<Server, ServeError> {
        Server::start_as(config, Role::Single).await
    }

    /// [`Server::start`] for a process of the given role: an executor's
    /// scheduling and memory admission are the supervisor's, over the seam.
    pub async fn start_as(mut config: Config, role: Role) -> Result<Server, ServeError> {
        // First: a directory another server holds stops this one before
        // TensorFlow loads. An executor keeps no state (its supervisor does).
        let restored = match (&role, config.state_dir.clone()) {
            (Role::Executor { .. }, _) => None,
            (_, None) => {
                tracing::warn!("no state directory (--state-dir, and no home to default to): \
                    tokens issued at run time and the job history are forgotten at a restart");
                None
            }
            (_, Some(dir)) => Some(restore_state(dir).await?),
        };
        let (gpu, capacity, capacity_source, gpu_lanes) = memory_setup(&mut config, &role)?;
        // The supervisor runs no TensorFlow: a child lists the devices for it.
        let DeviceList {
            devices,
            tensorflow_version: version,
        } = match role {
            Role::Supervisor => device_list::list_in_child().await?,
            _ => device_list::list_here(config.session_defaults).await?,
        };
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
        let executor = match &role {
            Role::Executor { seam, .. } => Executor::remote(policy, config.sched, seam.clone()),
            _ => Executor::with_timeline(policy, config.sched, timeline),
        };
        if !matches!(role, Role::Executor { .. }) {
            executor.set_limits_table(config.tenants.limits().clone());
        }
        let issued = restored.map(|restored| {
            executor.keep_history(restored.history, Some(restored.saver));
            restored.tokens
        });
        let admission = capacity.map(|capacity| {
            if let Role::Executor { seam, .. } = &role {
                return Admission::remote(seam.clone());
            }
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
            Admission::new(lanes, config.admission_timeout, executor.clone())
        });
        let settings = JobSettings {
            max_tensor_bytes: config.max_message_size as u64,
            inline_below: config.inline_below,
            cheap_below: config.cheap_below,
            measure_memory: admission.is_some(),
        };
        let mut state = ServerState::new(
            executor,
            admission,
            settings,
            config.session_defaults,
            Arc::new(config.tenant.clone()),
            config.max_sessions,
            devices,
            version,
        );
        if let Role::Executor { job_base, .. } = role {
            state.sessions.set_id_base(job_base);
        }
        state.gpu = gpu;
        state.capacity_source = capacity_source;
        Ok(Server {
            config,
            state: Arc::new(state),
            issued,
        })
    }

    /// Who tenants are: the tenants file, and the tokens issued before this
    /// start, whose reservations and limits are held again here, before any
    /// connection is accepted (so no job admitted first can take their memory).
    pub fn identifier(&mut self) -> Arc<Identifier> {
        let identifier = Identifier::new(self.config.auth, self.config.tenants.clone())
            .with_issued(self.issued.take().unwrap_or_default());
        crate::tenant::grants::hold_restored(&self.state.grant_holder(), &identifier);
        Arc::new(identifier)
    }

    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Serves on `listener` until `shutdown` resolves, lets in-flight requests
    /// finish (up to the configured grace period), then closes every session.
    pub async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let identifier = self.identifier();
        tracing::info!(auth = %self.config.auth, token_tenants = self.config.tenants.len(), "tenant identity");
        let counts = ConnectionCounts::new(self.config.max_tenant_connections);
        let incoming = identified_incoming(listener, identifier.clone(), counts);
        self.serve_incoming(incoming, identifier, shutdown, || {}).await
    }

    /// An executor process: serves its tenant's connections (handed over by
    /// the supervisor) and the calls the supervisor relays.
    pub async fn serve_executor<IO: ServedConnection>(
        self,
        incoming: impl tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
        tenant: Arc<crate::tenant::identity::Tenant>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        // The supervisor keeps relaying until every executor's eager jobs are
        // quiet, then stops taking calls itself, which ends the relayed streams.
        let seam = self.state.executor.seam().cloned();
        let drained = move || {
            if let Some(seam) = seam {
                seam.send(crate::seam::msg::to_supervisor::Msg::Drained(
                    crate::seam::msg::Drained {},
                ));
            }
        };
        self.serve_incoming(
            incoming,
            Arc::new(Identifier::fixed(tenant)),
            shutdown,
            drained,
        )
        .await
    }

    async fn serve_incoming<IO: ServedConnection>(
        self,
        incoming: impl tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
        identifier: Arc<Identifier>,
        shutdown: impl Future<Output = ()> + Send,
        after_drain: impl FnOnce() + Send,
    ) -> Result<(), ServeError> {
        let limit = self.config.max_message_size;
        let master = MasterServiceServer::new(Master::new(self.state.clone()))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let eager = EagerServiceServer::new(Eager::new(self.state.clone()))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let worker = WorkerServiceServer::new(Worker::new(self.state.clone()))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let admin = AdminServer::new(
            AdminService::new(self.state.clone())
                .with_admins(self.config.admins.clone())
                .with_identifier(identifier.clone()),
        );
        crate::tf::python_kernel::install(limit as u64, |token, op, node, inputs| {
            crate::runtime::python_calls::python_calls().call(token, op, node, inputs)
        });
        let (close_callbacks, callbacks_closing) = tokio::sync::watch::channel(false);
        let callbacks = PythonCallbacksServer::new(crate::frontend::callbacks::Callbacks::new(
            self.state.clone(),
            callbacks_closing,
        ))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<MasterServiceServer<Master>>().await;
        health.set_serving::<EagerServiceServer<Eager>>().await;
        health.set_serving::<AdminServer<AdminService>>().await;

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let grace = self.config.shutdown_grace;
        let draining = self.state.clone();
        let router = tonic::transport::Server::builder()
            // An executor's one connection carries all of its tenant's calls.
            .max_concurrent_streams(Some(100_000))
            .initial_stream_window_size(Some(H2_STREAM_WINDOW))
            .initial_connection_window_size(Some(H2_CONNECTION_WINDOW))
            .layer(IdentifyLayer::new(identifier))
            .add_service(health_service)
            .add_service(master)
            .add_service(eager)
            .add_service(worker)
            .add_service(admin)
            .add_service(callbacks)
            .serve_with_incoming_shutdown(incoming, async move {
                shutdown.await;
                tracing::info!("shutting down: finishing in-flight requests");
                let _ = stop_tx.send(());
                // A TF2 client fetches a call's result with later requests
                // (_Send, RecvTensor): keep serving those until eager jobs are
                // quiet, then stop taking requests.
                draining.drain_contexts(grace).await;
                // Scripts keep their Python callback streams open for as long as they run.
                let _ = close_callbacks.send(true);
                after_drain();
            });
        let reaper = self
            .config
            .idle_timeout
            .map(|timeout| tokio::spawn(reap_idle_sessions(self.state.clone(), timeout)));
        let context_reaper = tokio::spawn(reap_idle_contexts(
            self.state.clone(),
            self.config.idle_timeout,
        ));
        tokio::pin!(router);
        // After the signal, requests get `grace` to finish before sessions close anyway.
        let deadline = async {
            if stop_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = &mut router => result?,
            () = deadline => tracing::warn!(grace_s = grace.as_secs(), "requests still running after the grace period"),
        }
        health
            .set_not_serving::<MasterServiceServer<Master>>()
            .await;
        health.set_not_serving::<EagerServiceServer<Eager>>().await;
        if let Some(reaper) = reaper {
            reaper.abort();
        }
        context_reaper.abort();
        self.close_sessions().await;
        self.state.executor.stop();
        Ok(())
    }

    async fn close_sessions(&self) {
        let contexts = self.state.contexts.drain();
        for job in &contexts {
            // Frees a context thread waiting for its turn or for memory.
            self.state.executor.remove_job(job.id);
            if let Some(admission) = &self.state.admission {
                admission.withdraw(job.id);
            }
        }
        let closed_contexts = contexts.len();
        if let Err(err) = exec::blocking(move || {
            for job in contexts {
                job.close("the server is shutting down");
            }
            Ok(())
        })
        .await
        {
            tracing::error!(cause = %err, "closing eager contexts failed");
        }
        tracing::info!(contexts = closed_contexts, "all eager contexts closed");
        let jobs = self.state.sessions.drain();
        for job in &jobs {
            self.state.executor.remove_job(job.id);
        }
        let count = jobs.len();
        if let Err(err) = exec::blocking(move || {
            drop(jobs);
            Ok(())
        })
        .await
        {
            tracing::error!(cause = %err, "closing sessions failed");
        }
        tracing::info!(sessions = count, "all sessions closed");
    }
}

/// Closes sessions that received no request for `timeout` and have no
/// iteration queued or running: their client vanished without CloseSession.
async fn reap_idle_sessions(state: Arc<ServerState>, timeout: std::time::Duration) {
    let period = (timeout / 4).clamp(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(60),
    );
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        for job in state.sessions.all() {
            let busy = state
                .executor
                .job_status(job.id)
                .is_some_and(|s| s.queued > 0 || s.running > 0);
            if busy || job.is_busy() || job.idle_seconds() < timeout.as_secs_f64() {
                continue;
            }
            if let Some(job) = state.sessions.remove_any(&job.handle) {
                tracing::warn!(session = %job.handle, name = %job.name, idle_s = job.idle_seconds(), "closing idle session");
                state.count_reclaimed(false);
                // Its client left without closing it: not a run to learn from.
                state.executor.end_job(job.id, RunEnd::Failed);
                let _ = exec::drop_off_runtime(job).await;
            }
        }
    }
}

/// Closes eager contexts whose client stopped talking: idle longer than the
/// client's keep-alive (CreateContext.keep_alive_secs) or `--idle-timeout`,
/// whichever is shorter, with nothing queued or running.
async fn reap_idle_contexts(state: Arc<ServerState>, idle_timeout: Option<std::time::Duration>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        for job in state.contexts.all() {
            let limit = match (job.keep_alive, idle_timeout) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => continue,
            };
            if !job.is_busy() && job.idle_for() >= limit {
                tracing::warn!(context = job.context_id, name = %job.name, idle_s = job.idle_for().as_secs(), "closing idle eager context");
                state.count_reclaimed(true);
                state
                    .close_context(
                        job,
                        "it was idle longer than its keep-alive or --idle-timeout",
                        RunEnd::Failed,
                    )
                    .await;
            }
        }
    }
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
fn memory_setup(
    config: &mut Config,
    role: &Role,
) -> Result<(GpuProbe, Option<u64>, gpu_probe::CapacitySource, Option<GpuLanes>), Error> {
    let gpu = probe_gpu(config, role);
    let (capacity, capacity_source) = gpu_probe::memory_capacity(config.memory_capacity, config.gpu_lanes, &gpu);
    if capacity.is_none() && gpu.cuda_build {
        tracing::info!("no memory capacity (no --memory-capacity, no GPU): memory admission stays off");
    }
    let gpu_lanes = gpu_lanes(config, capacity)?;
    config.session_defaults.gpu_lanes = gpu_lanes;
    Ok((gpu, capacity, capacity_source, gpu_lanes))
}

/// `salus-server [FLAGS] probe-devices` (the supervisor's child, see
/// `runtime::device_list`): the devices the flags give jobs, as one line.
pub async fn probe_devices(mut config: Config) -> Result<String, ServeError> {
    memory_setup(&mut config, &Role::Single)?;
    Ok(device_list::to_line(&device_list::list_here(config.session_defaults).await?))
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
