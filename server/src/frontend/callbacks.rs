//! `salus.v1.PythonCallbacks`: the stream on which a script's process serves
//! the Python of its ops (see `runtime::python_calls`).

use std::pin::Pin;

use salus_proto::salus::v1::python_callbacks_server::PythonCallbacks;
use salus_proto::salus::v1::{CallbackCall, CallbackReply};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::runtime::python_calls::python_calls;

/// The service; its streams end when `closing` turns true (the server has
/// drained its in-flight work, which may have needed them, and stops).
pub struct Callbacks {
    closing: tokio::sync::watch::Receiver<bool>,
}

impl Callbacks {
    pub fn new(closing: tokio::sync::watch::Receiver<bool>) -> Callbacks {
        Callbacks { closing }
    }
}

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
}
