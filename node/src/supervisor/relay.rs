//! Relays a tenant's TensorFlow calls to its executor process: each HTTP/2
//! request, as it is, over the executor's HTTP/2 connection (a socketpair),
//! and the response back, trailers included. Nothing is decoded: the
//! supervisor runs no TensorFlow and parses no tenant protobuf.
//!
//! It carries the calls of connections that are not handed over (see
//! `accept::route`): TensorFlow calls from other gRPC clients (grpcio
//! tools), and connections an executor could not take. When an executor
//! dies, it answers their calls in flight with INTERNAL and what happened.
//! The price is a hop: about 200 us per call on a 2-core machine, which is
//! why TensorFlow's own clients are handed over instead.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::supervisor::executors::{
    ExecutorHandle, Executors, RelayRequestBody, StartError, SHUTTING_DOWN,
};
use crate::tenant::identity::Tenant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The tower service behind every path the supervisor does not serve itself.
#[derive(Clone)]
pub struct Relay {
    executors: Arc<Executors>,
}

impl Relay {
    pub fn new(executors: Arc<Executors>) -> Relay {
        Relay { executors }
    }
}

impl<B> tower::Service<Request<B>> for Relay
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<RelayBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let executors = self.executors.clone();
        Box::pin(async move { Ok(relay(executors, request).await) })
    }
}

fn status_response(code: tonic::Code, message: String) -> Response<RelayBody> {
    tonic::Status::new(code, message).into_http()
}

async fn relay<B>(executors: Arc<Executors>, request: Request<B>) -> Response<RelayBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Some(tenant) = request.extensions().get::<Arc<Tenant>>().cloned() else {
        return status_response(
            tonic::Code::Unauthenticated,
            "the request has no tenant".into(),
        );
    };
    let handle = match executors.get(&tenant).await {
        Ok(handle) => handle,
        // As a single-process server answers while it stops: clients wait for a server to come back.
        Err(StartError::ShuttingDown) => {
            return status_response(tonic::Code::Unavailable, SHUTTING_DOWN.into())
        }
        Err(_) if executors.is_closing() => {
            return status_response(tonic::Code::Unavailable, SHUTTING_DOWN.into())
        }
        // INTERNAL, not UNAVAILABLE: a stock TF1 client would retry the latter for a minute.
        Err(why) => return status_response(tonic::Code::Internal, why.to_string()),
    };
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = match format!("http://salus-executor{path}").parse() {
        Ok(uri) => uri,
        Err(_) => return status_response(tonic::Code::InvalidArgument, "bad request path".into()),
    };
    parts.extensions = http::Extensions::new();
    let body: RelayRequestBody = body.map_err(Into::into).boxed_unsync();
    let request = Request::from_parts(parts, body);
    let mut sender = handle.sender.clone();
    handle.begin_request();
    let guard = InFlight(handle.clone());
    match sender.send_request(request).await {
        Ok(response) => response.map(|body| RelayBody::Relaying {
            body,
            guard: Some(guard),
            failing: None,
        }),
        Err(err) => {
            drop(guard);
            if executors.is_closing() {
                return status_response(tonic::Code::Unavailable, SHUTTING_DOWN.into());
            }
            let message = if handle.is_dead() || err.is_closed() || err.is_canceled() {
                handle.failure().await
            } else {
                format!("relaying the call to the tenant's executor failed: {err}")
            };
            status_response(tonic::Code::Internal, message)
        }
    }
}

/// A request in flight at an executor (it is not idle).
pub struct InFlight(Arc<ExecutorHandle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

type Trailers = Pin<Box<dyn Future<Output = http::HeaderMap> + Send>>;

/// A response body from an executor. If the executor dies mid-response, the
/// body ends with trailers carrying INTERNAL and what happened to it.
#[derive(Default)]
pub enum RelayBody {
    #[default]
    Empty,
    Relaying {
        body: Incoming,
        guard: Option<InFlight>,
        failing: Option<Trailers>,
    },
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let RelayBody::Relaying {
            body,
            guard,
            failing,
        } = this
        else {
            return Poll::Ready(None);
        };
        if let Some(trailers) = failing {
            let headers = std::task::ready!(trailers.as_mut().poll(cx));
            *this = RelayBody::Empty;
            return Poll::Ready(Some(Ok(Frame::trailers(headers))));
        }
        match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            Some(Err(_)) => {
                let handle = guard.as_ref().map(|g| g.0.clone());
                *failing = Some(Box::pin(async move {
                    let message = match handle {
                        Some(h) => h.failure().await,
                        None => "the tenant's executor went away".into(),
                    };
                    // The status's own header encoding (grpc-message is percent-encoded).
                    let response = tonic::Status::internal(message).into_http::<RelayBody>();
                    let mut trailers = http::HeaderMap::new();
                    for name in ["grpc-status", "grpc-message"] {
                        if let Some(value) = response.headers().get(name) {
                            trailers.insert(name, value.clone());
                        }
                    }
                    trailers
                }));
                guard.take();
                Pin::new(this).poll_frame(cx)
            }
            None => {
                guard.take();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RelayBody::Empty => true,
            RelayBody::Relaying { body, failing, .. } => failing.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RelayBody::Relaying {
                body,
                failing: None,
                ..
            } => body.size_hint(),
            _ => SizeHint::default(),
        }
    }
}
