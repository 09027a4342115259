//! The supervisor's listener. Each accepted connection is identified (its
//! peer's Unix user, once), its prologue read ([`prologue`]) to learn its
//! first request's path and tenant, and then either handed to that tenant's
//! executor, socket and all, so that the executor serves it directly with no
//! hop through this process; or served here (see [`route`]), where the relay
//! carries TensorFlow calls to the executor.
//!
//! A connection's tenant is fixed by its first request: one client process
//! has one identity (its user, its `SALUS_TOKEN`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::frontend::identify::{refuse, IdentifiedStream};
use crate::http2::EMPTY_SETTINGS;
use crate::seam::handover::{Handed, MAX_READ_AHEAD};
use crate::seam::replayed::Replayed;
use crate::supervisor::executors::Executors;
use crate::supervisor::prologue::{FirstRequest, Prologue, Step};
use crate::tenant::connections::ConnectionCounts;
use crate::tenant::identity::{Identifier, PeerUser, Tenant};

/// How long a client may take, once connected, to send its first request.
/// gRPC clients connect when they have a call to make; a connection that
/// says nothing this long is closed (its client reconnects when it has one).
const PROLOGUE_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a connection goes.
#[derive(Debug)]
pub enum Route {
    Here,
    Executor(Arc<Tenant>),
}

/// Connections of TensorFlow's own client whose first call is one of its
/// services (master: TF1 graph sessions; eager and worker: TF2) are handed to
/// their tenant's executor. Everything else is served here: the admin API and
/// health checks, calls without a tenant (refused here with the reason), and
/// other clients' calls (grpcio tools), which the relay carries to the executor.
///
/// Why TF2's calls are handed over too (measured, TF2 CNN step of
/// `bench_eager.py`): through the relay they took 4-7% longer than in one
/// process (about 200 us a call), handed over 0-5%. A handed-over connection
/// would close with a dead executor, which TF2's eager client reports as a bare
/// "Socket closed" without retrying; the supervisor keeps a copy of each and
/// ends it with the cause instead (`handed`).
pub fn route(request: &FirstRequest, peer: &PeerUser, identifier: &Identifier) -> Route {
    let tensorflows_client = request.user_agent.as_deref().is_some_and(|ua| {
        ua.split_ascii_whitespace()
            .any(|word| word.starts_with(TENSORFLOW_AGENT))
    });
    let tensorflows_service = HANDED_OVER_SERVICES
        .iter()
        .any(|service| request.path.starts_with(service));
    if !tensorflows_service || !tensorflows_client {
        return Route::Here;
    }
    match identifier.identify(peer, request.user_agent.as_deref()) {
        Ok(tenant) => Route::Executor(tenant),
        Err(_) => Route::Here,
    }
}

const HANDED_OVER_SERVICES: [&str; 3] = [
    "/tensorflow.MasterService/",
    "/tensorflow.eager.EagerService/",
    "/tensorflow.WorkerService/",
];
/// TensorFlow's own gRPC (C++) names itself so in `user-agent`. Its channels
/// carry only TensorFlow's calls; other clients (grpcio tools, the `salus`
/// CLI) may mix admin calls into a connection, which only this process serves.
const TENSORFLOW_AGENT: &str = "grpc-c++/";

/// Accepts connections on `listener` for as long as the returned stream is
/// read; connections served here come out of it.
pub fn incoming(
    listener: TcpListener,
    identifier: Arc<Identifier>,
    executors: Arc<Executors>,
    counts: Arc<ConnectionCounts>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Replayed<IdentifiedStream>>> {
    let (here_tx, here_rx) = mpsc::unbounded_channel();
    let acceptor = tokio::spawn(async move {
        loop {
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => tcp,
                Err(err) => {
                    // Out of fds and the like: pause rather than spin.
                    tracing::warn!(cause = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let identifier = identifier.clone();
            let executors = executors.clone();
            let here = here_tx.clone();
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut stream = IdentifiedStream::accept(tcp, &identifier);
                if let Err(refused) = stream.admit(&counts) {
                    refuse(stream, refused).await;
                    return;
                }
                dispatch(stream, &identifier, &executors, &here).await;
            });
        }
    });
    Incoming {
        rx: here_rx,
        _acceptor: AbortOnDrop(acceptor),
    }
}

async fn dispatch(
    mut stream: IdentifiedStream,
    identifier: &Identifier,
    executors: &Arc<Executors>,
    here: &mpsc::UnboundedSender<std::io::Result<Replayed<IdentifiedStream>>>,
) {
    let read = tokio::time::timeout(PROLOGUE_TIMEOUT, read_prologue(&mut stream)).await;
    let (request, read_ahead, settings_acked) = match read {
        Ok(Ok(done)) => done,
        Ok(Err(err)) => {
            tracing::debug!(cause = %err, "connection closed before its first request");
            return;
        }
        Err(_) => {
            tracing::debug!("connection closed: no request within {PROLOGUE_TIMEOUT:?}");
            return;
        }
    };
    let tenant = match route(&request, &stream.peer().user, identifier) {
        Route::Here => {
            let _ = here.send(Ok(Replayed::new(read_ahead, stream, settings_acked)));
            return;
        }
        Route::Executor(tenant) => tenant,
    };
    let handle = match executors.get(&tenant).await {
        Ok(handle) => handle,
        Err(_) => {
            // The relay answers with the reason (it asks for the executor again).
            let _ = here.send(Ok(Replayed::new(read_ahead, stream, settings_acked)));
            return;
        }
    };
    let (conn, info, permit) = stream.into_parts();
    let conn = match conn.into_std() {
        Ok(conn) => std::os::fd::OwnedFd::from(conn),
        Err(err) => {
            tracing::warn!(cause = %err, "cannot take a connection off the runtime");
            return;
        }
    };
    let handed = Handed {
        conn,
        read_ahead,
        settings_acked,
    };
    let Err(failed) = handle.hand_over(handed, permit).await else {
        return;
    };
    tracing::warn!(tenant = %tenant, cause = %failed.why, "cannot hand a connection to its executor: relaying it");
    let Some((handed, permit)) = failed.returned else {
        return;
    };
    match tokio::net::TcpStream::from_std(std::net::TcpStream::from(handed.conn)) {
        Ok(tcp) => {
            let stream = IdentifiedStream::from_parts(tcp, info, permit);
            let _ = here.send(Ok(Replayed::new(
                handed.read_ahead,
                stream,
                handed.settings_acked,
            )));
        }
        Err(err) => tracing::warn!(cause = %err, "cannot serve a connection"),
    }
}

async fn read_prologue(
    stream: &mut IdentifiedStream,
) -> Result<(FirstRequest, Vec<u8>, bool), String> {
    stream
        .write_all(&EMPTY_SETTINGS)
        .await
        .map_err(|e| e.to_string())?;
    let mut prologue = Prologue::new(MAX_READ_AHEAD);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        match prologue.feed(&buf[..n]).map_err(|e| e.to_string())? {
            Step::More => {}
            Step::Reply(bytes) => stream.write_all(&bytes).await.map_err(|e| e.to_string())?,
            Step::Done {
                request,
                reply,
                read_ahead,
                settings_acked,
            } => {
                if !reply.is_empty() {
                    stream.write_all(&reply).await.map_err(|e| e.to_string())?;
                }
                return Ok((request, read_ahead, settings_acked));
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Incoming {
    rx: mpsc::UnboundedReceiver<std::io::Result<Replayed<IdentifiedStream>>>,
    _acceptor: AbortOnDrop,
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<Replayed<IdentifiedStream>>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::identity::{AuthMode, TenantsFile};

    #[test]
    fn tensorflows_calls_go_to_executors_the_rest_stays_here() {
        let identifier = Identifier::new(AuthMode::Uid, TenantsFile::default());
        let first = |path: &str| FirstRequest {
            path: path.into(),
            user_agent: Some("grpc-c++/1.74.0 grpc-c/49.0.0 (linux; chttp2)".into()),
        };
        let user = PeerUser::Uid(1000);
        for path in [
            "/tensorflow.MasterService/CreateSession",
            "/tensorflow.eager.EagerService/CreateContext",
            "/tensorflow.WorkerService/GetStatus",
        ] {
            assert!(
                matches!(route(&first(path), &user, &identifier), Route::Executor(t) if t.uid == Some(1000)),
                "{path}"
            );
        }
        for path in ["/salus.v1.Admin/ListJobs", "/grpc.health.v1.Health/Check"] {
            assert!(
                matches!(route(&first(path), &user, &identifier), Route::Here),
                "{path}"
            );
        }
        // Another gRPC client (grpcio tools may mix admin calls in): served here.
        let grpcio = FirstRequest {
            path: "/tensorflow.MasterService/CreateSession".into(),
            user_agent: Some("grpc-python/1.76.0 grpc-c/49.0.0 (linux; chttp2)".into()),
        };
        assert!(matches!(route(&grpcio, &user, &identifier), Route::Here));
        // No tenant: refused here, with the reason.
        let unknown = PeerUser::Unknown("another network namespace".into());
        assert!(matches!(
            route(
                &first("/tensorflow.MasterService/CreateSession"),
                &unknown,
                &identifier
            ),
            Route::Here
        ));
    }
}
