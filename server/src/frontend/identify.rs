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

use crate::tenant::identity::{Identifier, PeerUser, Tenant};
use crate::tenant::peer_uid::peer_uid;

/// An accepted connection and who is at its other end.
pub struct IdentifiedStream {
    stream: TcpStream,
    info: PeerInfo,
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
        }
    }
}

impl IdentifiedStream {
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }

    /// The socket and what is known of its peer (to hand the socket on).
    pub fn into_parts(self) -> (TcpStream, PeerInfo) {
        (self.stream, self.info)
    }

    pub fn from_parts(stream: TcpStream, info: PeerInfo) -> IdentifiedStream {
        IdentifiedStream { stream, info }
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
/// it, with Nagle off (small RunSteps are latency-bound).
pub fn identified_incoming(
    listener: tokio::net::TcpListener,
    identifier: Arc<Identifier>,
) -> impl tokio_stream::Stream<Item = io::Result<IdentifiedStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |stream| {
        stream.map(|stream| {
            let _ = stream.set_nodelay(true);
            IdentifiedStream::accept(stream, &identifier)
        })
    })
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
