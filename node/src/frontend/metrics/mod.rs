//! `--metrics-listen`: Prometheus' `/metrics` on an HTTP/1 listener of its own
//! (hyper), apart from the gRPC port so a scraper needs no gRPC and the
//! endpoint can be bound to another interface or left off.
//!
//! A scrape reads the admin API's messages off the async runtime (job rows
//! walk graphs under TensorFlow's lock) and encodes them ([`collector`]).

pub mod collector;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::frontend::admin::AdminService;
use crate::runtime::exec;
use collector::Scrape;

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 32;
/// A client must send its request head within this (no slow-header hold-ups).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `/metrics` on `listener` until the task is dropped.
/// `admin` is the admin API whose messages the metrics show.
pub async fn serve(listener: TcpListener, admin: AdminService) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors and the like: try again shortly.
                tracing::warn!(cause = %err, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| respond(request, admin.clone()));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(err) = connection.await {
                tracing::debug!(cause = %err, "metrics connection ended with an error");
            }
            drop(permit);
        });
    }
}

async fn respond(
    request: Request<Incoming>,
    admin: AdminService,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        response
            .headers_mut()
            .insert(ALLOW, "GET, HEAD".parse().expect("a valid header value"));
        return Ok(response);
    }
    let response = match request.uri().path() {
        "/metrics" => match scrape(admin).await {
            Ok(body) => {
                let mut response = text(StatusCode::OK, body);
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE
                        .parse()
                        .expect("a valid header value"),
                );
                response
            }
            Err(err) => {
                tracing::error!(cause = %err, "metrics scrape failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("scrape failed: {err}\n"),
                )
            }
        },
        "/" => text(StatusCode::OK, "salus-server: metrics at /metrics\n".into()),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n".into(),
        ),
    };
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        "text/plain; charset=utf-8"
            .parse()
            .expect("a valid header value"),
    );
    response
}

/// One scrape: the admin API's view now, encoded.
async fn scrape(admin: AdminService) -> crate::error::Result<String> {
    exec::blocking(move || {
        let (info, jobs) = admin.snapshot();
        let scrape = Scrape {
            info,
            jobs,
            stats: admin.scheduler_stats(),
        };
        collector::encode(scrape)
            .map_err(|_| crate::error::Error::Internal("cannot encode the metrics".into()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `request` raw and returns the whole response (the server closes after it).
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
            .await
            .expect("the server answers and closes")
            .unwrap();
        String::from_utf8_lossy(&response).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_refuses_everything_else() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, {
            use crate::runtime::executor::Executor;
            use crate::runtime::job_source::{Gathered, JobSource, Viewer};
            use crate::runtime::node::Node;
            use crate::sched::{policy, SchedConfig};
            /// A process with no job (the jobs are salus-server's).
            struct NoJobs;
            impl JobSource for NoJobs {
                fn gather(&self, _: &Node, _: Option<&Viewer>) -> Gathered {
                    Gathered::default()
                }
                fn stop_tenant(&self, _: &crate::tenant::identity::TenantKey, _: &str) {}
            }
            let executor = Executor::new(policy::by_name("fair").unwrap(), SchedConfig::default());
            let node = std::sync::Arc::new(Node::new(
                crate::runtime::sched_port::SchedPort::Local(executor),
                None,
                Vec::new(),
                "2.21.0".into(),
            ));
            AdminService::new(node, std::sync::Arc::new(NoJobs)).unwrap()
        }));

        let ok = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{ok}"
        );
        assert!(ok.contains("salus_server_info{version=\""), "{ok}");
        assert!(ok.contains("policy=\"fair\"} 1"), "{ok}");
        assert!(ok.contains("\nsalus_iterations_total 0\n"), "{ok}");

        let post = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("allow: GET, HEAD\r\n"), "{post}");
        let missing = exchange(
            addr,
            b"GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        // Garbage is answered with 400 (or the connection closed), and the listener keeps serving.
        let garbage = exchange(addr, b"\x00\xffNOT HTTP AT ALL\r\n\r\n").await;
        assert!(
            garbage.is_empty() || garbage.starts_with("HTTP/1.1 400 "),
            "{garbage}"
        );
        let again = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(again.starts_with("HTTP/1.1 200 OK\r\n"), "{again}");
        server.abort();
    }
}
