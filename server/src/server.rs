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
use crate::frontend::admin::AdminService;
use crate::frontend::eager::{Eager, Worker};
use crate::frontend::identify::{identified_incoming, IdentifyLayer};
use crate::frontend::master::Master;
use crate::http2::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};
use crate::node_start::NodeStart;
use crate::runtime::device_list;
use crate::runtime::exec;
use crate::runtime::graph_job::JobSettings;
use crate::runtime::state::ServerState;
use crate::sched::RunEnd;
use crate::tenant::connections::ConnectionCounts;
use crate::tenant::identity::Identifier;

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

pub use crate::node_start::{Role, ServeError};

/// A started server: TensorFlow initialised, devices known.
pub struct Server {
    config: Config,
    state: Arc<ServerState>,
    start: NodeStart,
}

impl Server {
    /// Initialises TensorFlow and lists the devices every session will see.
    pub async fn start(config: Config) -> Result<Server, ServeError> {
        Server::start_as(config, Role::Single).await
    }

    /// [`Server::start`] for a process of the given role: an executor's
    /// scheduling and memory admission are the supervisor's, over the seam.
    pub async fn start_as(config: Config, role: Role) -> Result<Server, ServeError> {
        let start = NodeStart::begin(config, &role, device_list::list_here).await?;
        let config = start.config.clone();
        let settings = JobSettings {
            max_tensor_bytes: config.max_message_size as u64,
            inline_below: config.inline_below,
            cheap_below: config.cheap_below,
            measure_memory: start.node.admission.is_some(),
        };
        let mut state = ServerState::new(
            start.node.clone(),
            settings,
            config.session_defaults,
            Arc::new(config.tenant.clone()),
            config.max_sessions,
        );
        if let Role::Executor { job_base, .. } = role {
            state.sessions.set_id_base(job_base);
        }
        Ok(Server {
            config,
            state: Arc::new(state),
            start,
        })
    }

    /// Who tenants are (see [`NodeStart::identifier`]).
    pub fn identifier(&mut self) -> Arc<Identifier> {
        self.start.identifier()
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
        let seam = self.state.sched.seam().cloned();
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
        // The admin API is the scheduling process's: a tenant's executor has none.
        let admin = AdminService::new(self.state.node.clone(), self.state.clone()).map(|admin| {
            let admin = admin
                .with_admins(self.config.admins.clone())
                .with_identifier(identifier.clone());
            tokio::spawn(crate::reload::on_sighup(admin.clone()));
            AdminServer::new(admin)
        });
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
        if admin.is_some() {
            health.set_serving::<AdminServer<AdminService>>().await;
        }

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
            .add_optional_service(admin)
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
        if let Some(core) = self.state.sched.core() {
            core.stop();
        }
        Ok(())
    }

    async fn close_sessions(&self) {
        let contexts = self.state.contexts.drain();
        for job in &contexts {
            // Frees a context thread waiting for its turn or for memory.
            self.state.sched.remove_job(job.id);
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
            self.state.sched.remove_job(job.id);
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
                .sched
                .job_status(job.id)
                .is_some_and(|s| s.queued > 0 || s.running > 0);
            if busy || job.is_busy() || job.idle_seconds() < timeout.as_secs_f64() {
                continue;
            }
            if let Some(job) = state.sessions.remove_any(&job.handle) {
                tracing::warn!(session = %job.handle, name = %job.name, idle_s = job.idle_seconds(), "closing idle session");
                state.count_reclaimed(false);
                // Its client left without closing it: not a run to learn from.
                state.sched.end_job(job.id, RunEnd::Failed);
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

/// `salus-server [FLAGS] probe-devices` (the supervisor's child, see
/// `runtime::device_list`): the devices the flags give jobs, as one line.
pub async fn probe_devices(mut config: Config) -> Result<String, ServeError> {
    crate::node_start::memory_setup(&mut config, &Role::Single)?;
    Ok(device_list::to_line(&device_list::list_here(config.session_defaults).await?))
}
