//! `salus.v1.PythonCallbacks`: the stream on which a script's process serves
//! the Python of its ops (see `runtime::python_calls`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use salus_proto::salus::v1::python_callbacks_server::PythonCallbacks;
use salus_proto::salus::v1::{CallbackCall, CallbackReply, StalledWait, StalledWaitAnswer};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::frontend::identify::tenant_of;
use crate::runtime::eager_job;
use crate::runtime::python_calls::python_calls;
use crate::runtime::state::ServerState;

/// The service; its streams end when `closing` turns true (the server has
/// drained its in-flight work, which may have needed them, and stops).
pub struct Callbacks {
    state: Arc<ServerState>,
    closing: tokio::sync::watch::Receiver<bool>,
}

impl Callbacks {
    pub fn new(state: Arc<ServerState>, closing: tokio::sync::watch::Receiver<bool>) -> Callbacks {
        Callbacks { state, closing }
    }
}

/// What a client may say it waited for, in the error (one line, bounded).
const WAITING_FOR_LIMIT: usize = 200;

#[tonic::async_trait]
impl PythonCallbacks for Callbacks {
    type ServeStream = Pin<Box<dyn Stream<Item = Result<CallbackCall, Status>> + Send>>;

    async fn serve(
        &self,
        request: Request<Streaming<CallbackReply>>,
    ) -> Result<Response<Self::ServeStream>, Status> {
        let mut replies = request.into_inner();
        let first = replies.message().await?.ok_or_else(|| {
            Status::invalid_argument("the callback stream ended before naming its client")
        })?;
        let (registration, calls) = python_calls().register(&first.client)?;
        // The stream is served until the script ends it (or its connection
        // drops); then the calls still waiting for it fail.
        tokio::spawn(async move {
            while let Ok(Some(reply)) = replies.message().await {
                python_calls().reply(&registration, reply);
            }
            drop(registration);
        });
        // The calls go out until the server closes; then the stream ends.
        let (out, out_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut calls = calls;
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    call = calls.recv() => {
                        let Some(call) = call else { break };
                        if out.send(call).is_err() {
                            break;
                        }
                    }
                    _ = closing.wait_for(|closing| *closing) => break,
                }
            }
        });
        Ok(Response::new(Box::pin(
            UnboundedReceiverStream::new(out_rx).map(Ok),
        )))
    }

    async fn end_stalled_wait(
        &self,
        request: Request<StalledWait>,
    ) -> Result<Response<StalledWaitAnswer>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        // Another tenant's context is not found, as on the eager service.
        let job = self.state.contexts.peek(&tenant.key, req.context_id)?;
        if !(req.waited_seconds.is_finite() && req.waited_seconds >= 0.0) {
            return Err(Status::invalid_argument(
                "waited_seconds must be a finite, non-negative number",
            ));
        }
        let waited = Duration::from_secs_f64(req.waited_seconds.min(1e9));
        let mut waiting_for: String = req
            .waiting_for
            .chars()
            .filter(|c| !c.is_control())
            .take(WAITING_FOR_LIMIT)
            .collect();
        if waiting_for.is_empty() {
            waiting_for = "its pending ops".into();
        }
        let seen = job.end_stalled_streams(waited, &waiting_for);
        Ok(Response::new(StalledWaitAnswer {
            ended: seen == eager_job::StalledWait::Ended,
            state: seen.label().into(),
        }))
    }
}
