//! Puts a tenant on every request: the peer's Unix user is looked up once, when
//! the connection is accepted ([`IdentifiedStream`]); each request's tenant is
//! resolved from it and the request's `user-agent` ([`IdentifyLayer`]) and
//! travels in the request's extensions to the front ends ([`tenant_of`]).
//! A request that cannot be attributed is answered UNAUTHENTICATED here,
//! before any service sees it. Health checks need no identity.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::Connected;

use crate::tenant::connections::{ConnectionCounts, ConnectionPermit, Owner, Refused};
use crate::tenant::identity::{Identifier, PeerUser, Tenant};
use crate::tenant::peer_uid::peer_uid;

/// An accepted connection and who is at its other end.
pub struct IdentifiedStream {
    stream: TcpStream,
    info: PeerInfo,
    /// Its place among its owner's connections (`--max-tenant-connections`),
    /// given back when the server lets the connection go.
    permit: Option<ConnectionPermit>,
}

/// What is known of a connection's peer, in every request's extensions.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub user: PeerUser,
    pub remote: Option<SocketAddr>,
}

impl IdentifiedStream {
    /// Looks the peer's user up when `identifier` needs it (one sock_diag
    /// query, tens of microseconds, once per connection).
    pub fn accept(stream: TcpStream, identifier: &Identifier) -> IdentifiedStream {
        let remote = stream.peer_addr().ok();
        let user = if !identifier.wants_peer_user() {
            PeerUser::Unknown("not looked up under this --auth".into())
        } else {
            match (stream.local_addr(), remote) {
                (Ok(local), Some(peer)) => match peer_uid(local, peer) {
                    Ok(uid) => PeerUser::Uid(uid),
                    Err(err) => PeerUser::Unknown(err.to_string()),
                },
                _ => PeerUser::Unknown("the connection's addresses are unknown".into()),
            }
        };
        IdentifiedStream {
            stream,
            info: PeerInfo { user, remote },
            permit: None,
        }
    }

    /// Counts this connection against its owner's cap. A loopback peer's user
    /// is looked up for it when the `--auth` mode did not.
    pub fn admit(&mut self, counts: &Arc<ConnectionCounts>) -> Result<(), Refused> {
        let owner = Owner::of(&self.info.user, self.info.remote, || {
            let local = self.stream.local_addr().ok()?;
            peer_uid(local, self.info.remote?).ok()
        });
        self.permit = Some(counts.admit(owner)?);
        Ok(())
    }
}

impl IdentifiedStream {
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }

    /// The socket, what is known of its peer and its place among its owner's
    /// connections (to hand the socket on).
    pub fn into_parts(self) -> (TcpStream, PeerInfo, Option<ConnectionPermit>) {
        (self.stream, self.info, self.permit)
    }

    pub fn from_parts(
        stream: TcpStream,
        info: PeerInfo,
        permit: Option<ConnectionPermit>,
    ) -> IdentifiedStream {
        IdentifiedStream {
            stream,
            info,
            permit,
        }
    }
}

impl Connected for IdentifiedStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for IdentifiedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for IdentifiedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// `listener`'s connections, each with its peer's user as `identifier` needs
/// it, with Nagle off (small RunSteps are latency-bound). A connection over
/// its owner's cap is refused (told why, then closed) and not served.
pub fn identified_incoming(
    listener: tokio::net::TcpListener,
    identifier: Arc<Identifier>,
    counts: Arc<ConnectionCounts>,
) -> impl tokio_stream::Stream<Item = io::Result<IdentifiedStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |stream| {
        let stream = match stream {
            Ok(stream) => stream,
            Err(err) => return Some(Err(err)),
        };
        let _ = stream.set_nodelay(true);
        let mut stream = IdentifiedStream::accept(stream, &identifier);
        match stream.admit(&counts) {
            Ok(()) => Some(Ok(stream)),
            Err(refused) => {
                tokio::spawn(refuse(stream, refused));
                None
            }
        }
    })
}

/// Tells a connection over its owner's cap why it is closed: the server's
/// SETTINGS and a GOAWAY (ENHANCE_YOUR_CALM) whose debug text stock gRPC
/// clients show in their error, then the end of the connection.
pub async fn refuse(mut stream: IdentifiedStream, refused: Refused) {
    use tokio::io::AsyncWriteExt;
    log_refusal(&refused);
    let mut bytes = crate::http2::EMPTY_SETTINGS.to_vec();
    bytes.extend(crate::http2::goaway_frame(
        crate::http2::ENHANCE_YOUR_CALM,
        &refused.to_string(),
    ));
    // A client that reads nothing cannot hold this task: a second at most.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Logs the server's first refusal, then one in 1,000 (a client retrying in a
/// loop must not flood the log).
fn log_refusal(refused: &Refused) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    let n = REFUSED.fetch_add(1, Ordering::Relaxed);
    if n.is_multiple_of(1000) {
        tracing::warn!(owner = %refused.owner, cap = refused.cap, refused_so_far = n + 1,
            "connection refused: over --max-tenant-connections");
    }
}

/// The request's tenant, put there by [`IdentifyLayer`]. A request that did
/// not pass the layer (a handler called directly, in unit tests) belongs to
/// the anonymous tenant, as under `--auth off`.
pub fn tenant_of<T>(request: &tonic::Request<T>) -> Arc<Tenant> {
    request
        .extensions()
        .get::<Arc<Tenant>>()
        .cloned()
        .unwrap_or_else(|| Arc::new(Tenant::anonymous()))
}

/// The tower layer that resolves every request's tenant.
#[derive(Clone)]
pub struct IdentifyLayer {
    identifier: Arc<Identifier>,
}

impl IdentifyLayer {
    pub fn new(identifier: Arc<Identifier>) -> IdentifyLayer {
        IdentifyLayer { identifier }
    }
}

impl<S> tower::Layer<S> for IdentifyLayer {
    type Service = Identify<S>;

    fn layer(&self, inner: S) -> Identify<S> {
        Identify {
            inner,
            identifier: self.identifier.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Identify<S> {
    inner: S,
    identifier: Arc<Identifier>,
}

/// Paths served without identity: liveness checks.
const OPEN_PATH_PREFIX: &str = "/grpc.health.v1.Health/";

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Identify<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        if !request.uri().path().starts_with(OPEN_PATH_PREFIX) {
            let unknown = PeerUser::Unknown("the connection was not identified".into());
            let peer = request
                .extensions()
                .get::<PeerInfo>()
                .map_or(&unknown, |info| &info.user);
            let user_agent = request
                .headers()
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok());
            match self.identifier.identify(peer, user_agent) {
                Ok(tenant) => {
                    request.extensions_mut().insert(tenant);
                }
                Err(err) => {
                    tracing::warn!(path = request.uri().path(), cause = %err, "request refused: no tenant");
                    let response = tonic::Status::unauthenticated(err.to_string()).into_http();
                    return Box::pin(async move { Ok(response) });
                }
            }
        }
        Box::pin(self.inner.call(request))
    }
}
