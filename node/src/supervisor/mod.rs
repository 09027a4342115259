//! The supervisor (`--isolation tenant`, the default): the process users
//! start. It keeps the listener, tenant identity, the one scheduler core and
//! memory admission, the admin API and metrics, and runs no TensorFlow on
//! anything a tenant sent: each tenant's connections are handed to that
//! tenant's executor process ([`accept`], [`executors`]), whose scheduling
//! requests come back over the seam ([`link`]). What cannot be handed over is
//! relayed ([`relay`]).

pub mod accept;
mod adopt;
mod checkpoint_dir;
mod death;
pub mod executor_log;
pub mod executors;
pub mod handed;
pub mod keeper;
pub mod link;
pub mod pidfd;
pub mod prologue;
pub mod relay;
mod spawn;

use std::future::Future;

use salus_proto::salus::v1::admin_server::AdminServer;
use tokio::net::TcpListener;

use crate::error::Error;
use crate::frontend::admin::AdminService;
use crate::frontend::identify::IdentifyLayer;
use crate::http2::{H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};
use crate::node_start::{NodeStart, ServeError};
use crate::process::Stop;
use crate::supervisor::executors::{ExecutorSpec, Executors};
use crate::supervisor::relay::Relay;
use crate::tenant::connections::ConnectionCounts;

/// Serves `listener` as the supervisor until `shutdown`. A full stop stops
/// taking calls, lets the executors finish theirs (up to the grace period) and
/// stops them; a restart returns at once and leaves the executors for the next
/// supervisor, which adopts them (`adopt`).
pub async fn serve(
    mut start: NodeStart,
    listener: TcpListener,
    spec: ExecutorSpec,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = Stop> + Send + 'static,
) -> Result<Stop, ServeError> {
    let config = start.config.clone();
    let node = start.node.clone();
    let Some(core) = node.sched.core().cloned() else {
        return Err(ServeError::Startup(Error::Internal(
            "the supervisor was started as a tenant's executor".into(),
        )));
    };
    let executors = Executors::new(
        spec,
        core.clone(),
        node.admission.clone(),
        tokio::runtime::Handle::current(),
    );
    // Before the first connection is accepted: restored tokens' reservations
    // are held, and the jobs of executors a predecessor left are scheduled
    // (their memory held) before any new job asks.
    let identifier = start.identifier();
    let adopted = executors.adopt_orphans().await;
    if adopted > 0 {
        tracing::info!(
            executors = adopted,
            "adopted the running executors of the previous supervisor"
        );
    }
    tracing::info!(auth = %config.auth, token_tenants = config.tenants.len(), "tenant identity; isolation: one executor process per tenant");
    let counts = ConnectionCounts::new(config.max_tenant_connections);
    let incoming = accept::incoming(listener, identifier.clone(), executors.clone(), counts);
    let admin = AdminService::new(node.clone(), executors.clone())
        .ok_or_else(|| Error::Internal("the supervisor schedules nothing".into()))?
        .with_admins(config.admins.clone())
        .with_identifier(identifier.clone());
    if let Some(metrics) = metrics {
        tokio::spawn(crate::frontend::metrics::serve(metrics, admin.clone()));
    }
    tokio::spawn(crate::reload::on_sighup(admin.clone()));
    let admin = AdminServer::new(admin);
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in [
        "tensorflow.MasterService",
        "tensorflow.eager.EagerService",
        "salus.v1.Admin",
    ] {
        health
            .set_service_status(service, tonic_health::ServingStatus::Serving)
            .await;
    }
    let routes = tonic::service::Routes::new(health_service).add_service(admin);
    let routes = tonic::service::Routes::from(
        routes
            .into_axum_router()
            .fallback_service(Relay::new(executors.clone())),
    );
    let idle = tokio::spawn(executors.clone().stop_idle());
    let grace = config.shutdown_grace;
    let stopping = executors.clone();
    let (restart_tx, restart_rx) = tokio::sync::oneshot::channel();
    let served = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(H2_STREAM_WINDOW))
        .initial_connection_window_size(Some(H2_CONNECTION_WINDOW))
        .layer(IdentifyLayer::new(identifier))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, async move {
            let stop = shutdown.await;
            if stop != Stop::Full {
                let _ = restart_tx.send(stop);
                // The process ends without waiting for calls in flight.
                std::future::pending::<()>().await;
            }
            tracing::info!("shutting down: executors finish their tenants' requests");
            idle.abort();
            // Relayed eager follow-ups (RecvTensor) are served until the
            // executors' eager jobs are quiet; then this server stops taking calls.
            stopping.drain_all(grace).await;
        });
    tokio::select! {
        served = served => served?,
        Ok(stop) = restart_rx => {
            let running = executors.running().len();
            tracing::info!(executors = running, "the supervisor stops; its executors keep their jobs for the next one");
            return Ok(stop);
        }
    }
    executors
        .stop_all(grace + std::time::Duration::from_secs(5))
        .await;
    core.stop();
    Ok(Stop::Full)
}
