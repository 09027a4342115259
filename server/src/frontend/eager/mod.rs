//! The remote-eager front end: `tensorflow.eager.EagerService` and the two
//! `tensorflow.WorkerService` methods a TF2 client calls (GetStatus,
//! RecvTensor). One eager context is one job; its requests become runtime
//! [`Item`]s executed in order by the job's thread.

mod translate;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use salus_proto::tensorflow::eager::eager_service_server::EagerService;
use salus_proto::tensorflow::eager::*;
use salus_proto::tensorflow::worker_service_server::WorkerService;
use salus_proto::tensorflow::{
    DeviceAttributes, GetStatusRequest, GetStatusResponse, RecvTensorRequest, RecvTensorResponse,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{Error, Result};
use crate::frontend::identify::tenant_of;
use crate::runtime::eager_devices::DeviceNames;
use crate::runtime::eager_job::{
    EagerJob, EagerJobSpec, Item, ItemOutput, Scheduling, StreamState, MAX_BATCHES_IN_FLIGHT,
};
use crate::runtime::exec;
use crate::runtime::rendezvous::UNANNOUNCED_GRACE;
use crate::runtime::session_config::session_config;
use crate::runtime::state::ServerState;
use crate::runtime::timeline::JobKind;
use crate::sched::Hints;
use crate::tenant::identity::Tenant;
use crate::tf::DeviceInfo;

pub use translate::{enqueue_response, queue_items};

/// How long a context whose last stream ended waits for the client to open a
/// new one (or send anything) before it is reclaimed: the stock client never
/// closes its context, it just exits.
pub const STREAM_END_GRACE: Duration = Duration::from_secs(3);

pub struct Eager {
    state: Arc<ServerState>,
}

impl Eager {
    pub fn new(state: Arc<ServerState>) -> Eager {
        Eager { state }
    }
}

/// The server's devices as `names` shows them to the client.
fn device_attributes(
    devices: &[DeviceInfo],
    rename: impl Fn(&str) -> String,
) -> Vec<DeviceAttributes> {
    devices
        .iter()
        .map(|d| DeviceAttributes {
            name: rename(&d.name),
            device_type: d.device_type.clone(),
            memory_limit: d.memory_bytes,
            incarnation: d.incarnation,
            xla_global_id: -1,
            ..Default::default()
        })
        .collect()
}

type PendingReply = std::result::Result<oneshot::Receiver<Result<Vec<ItemOutput>>>, Error>;

impl Eager {
    /// What CreateContext refuses before anything is opened: a job name that
    /// is none, a context id the tenant uses already.
    fn check_new_context(
        &self,
        tenant: &Tenant,
        req: &CreateContextRequest,
        server_def: &ServerDef,
    ) -> Result<()> {
        if !is_job_name(&server_def.job_name) {
            return Err(Error::InvalidArgument(format!(
                "CreateContext: server_def.job_name {:?} is not a job name (letters, digits and '_', starting \
                 with a letter); it must name this server's job in the client's cluster",
                server_def.job_name
            )));
        }
        if self.state.contexts.contains(&tenant.key, req.context_id) {
            return Err(Error::InvalidArgument(format!(
                "EagerService:CreateContext failed: context id <{}> already exists",
                req.context_id
            )));
        }
        if req.clear_existing_contexts {
            // Other tenants' contexts are not the client's to clear.
            tracing::info!(
                context = req.context_id,
                "ignoring clear_existing_contexts on a shared server"
            );
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl EagerService for Eager {
    async fn create_context(
        &self,
        request: Request<CreateContextRequest>,
    ) -> Result<Response<CreateContextResponse>, Status> {
        let tenant = tenant_of(&request);
        let mut req = request.into_inner();
        let server_def = req.server_def.take().unwrap_or_default();
        self.check_new_context(&tenant, &req, &server_def)?;
        let (config, metadata_name) = session_config(
            &server_def.default_session_config,
            self.state.session_defaults,
        )?;
        let hints = Hints::parse(&metadata_name).map_err(Error::from)?;
        let other_jobs = server_def
            .cluster
            .as_ref()
            .map(|c| c.job.iter().map(|j| j.name.clone()).collect())
            .unwrap_or_default();
        let opening = self
            .state
            .begin_job(JobKind::Eager, tenant.as_ref(), &hints.name)
            .await?;
        let id = opening.id();
        // GPU lanes: the job's GPU ops run on the virtual GPU of the roomiest lane.
        let devices = DeviceNames::new(
            &server_def.job_name,
            server_def.replica,
            server_def.task_index,
            other_jobs,
        )
        .with_gpu_lane(opening.gpu_lane.map(|l| l.0));
        let spec = EagerJobSpec {
            id,
            context_id: req.context_id,
            hints: hints.clone(),
            config,
            devices: devices.clone(),
            keep_alive: (req.keep_alive_secs > 0)
                .then(|| Duration::from_secs(req.keep_alive_secs as u64)),
            context_view_id: req.context_view_id,
            max_tensor_bytes: self.state.settings.max_tensor_bytes,
            tenant: self.state.rules_for(&tenant),
            checkpoint_dir: self.state.tenant.checkpoints.dir_for(&hints.name, id),
            scheduling: Scheduling {
                iterations: self.state.iterations.clone(),
                runtime: tokio::runtime::Handle::current(),
                cheap_below: self.state.settings.cheap_below,
                measure_memory: self.state.settings.measure_memory,
                gpu_lane: opening.gpu_lane,
            },
        };
        let job = Arc::new(exec::blocking(move || EagerJob::create(spec)).await?);
        opening
            .open(job, hints.clone(), |job| {
                self.state.insert_context(tenant.clone(), job)
            })
            .await?;
        tracing::info!(
            context = req.context_id,
            job = id.0,
            name = %hints.name,
            tenant = %tenant,
            server = %devices.client_prefix(),
            ?hints,
            "eager context created"
        );
        Ok(Response::new(CreateContextResponse {
            device_attributes: device_attributes(&self.state.devices, |n| devices.to_client(n)),
        }))
    }

    async fn update_context(
        &self,
        request: Request<UpdateContextRequest>,
    ) -> Result<Response<UpdateContextResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        self.state.contexts.get(&tenant.key, req.context_id)?;
        Err(Error::Unimplemented(
            "UpdateContext: a Salus server is one task and keeps a context's cluster fixed; \
             reconnect with a new context instead of updating the cluster"
                .into(),
        )
        .into())
    }

    async fn enqueue(
        &self,
        request: Request<EnqueueRequest>,
    ) -> Result<Response<EnqueueResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.contexts.get(&tenant.key, req.context_id)?;
        let items = queue_items(req.queue)?;
        tracing::trace!(context = req.context_id,
                        items = ?items.iter().map(Item::label).collect::<Vec<_>>(), "unary request");
        if items.iter().all(|i| matches!(i, Item::Decref { .. })) {
            // The client sends each released handle in a request of its own and
            // ignores the answer: queue it in order, answer at once.
            let count = items.len();
            let admitted = job.admit().await?;
            drop(job.submit(items, None, admitted)?);
            return Ok(Response::new(enqueue_response(vec![
                ItemOutput::default();
                count
            ])));
        }
        let outputs = job.run(items).await?;
        Ok(Response::new(enqueue_response(outputs)))
    }

    type StreamingEnqueueStream =
        Pin<Box<dyn Stream<Item = Result<EnqueueResponse, Status>> + Send>>;

    async fn streaming_enqueue(
        &self,
        request: Request<Streaming<EnqueueRequest>>,
    ) -> Result<Response<Self::StreamingEnqueueStream>, Status> {
        let tenant = tenant_of(&request);
        let inbound = request.into_inner();
        let (out_tx, out_rx) = mpsc::channel(256);
        // The requests read and not yet answered: a client that does not read
        // its answers is not read further either.
        let (pending_tx, pending_rx) = mpsc::channel::<PendingReply>(MAX_BATCHES_IN_FLIGHT);
        let stream = Arc::new(StreamState::new());
        let reader = tokio::spawn(read_stream(
            self.state.clone(),
            tenant,
            inbound,
            pending_tx,
            stream.clone(),
        ));
        let state = self.state.clone();
        let writer_stream = stream.clone();
        tokio::spawn(async move {
            let closed = out_tx.clone();
            let errored = write_stream(pending_rx, out_tx, &writer_stream).await;
            stream.failed.store(true, Ordering::SeqCst);
            if errored {
                // The transport drops the receiver once it has sent the status
                // that ended the stream; pulls failed by the same error wait
                // for that (StreamState::wait_until_status_sent).
                let _ = tokio::time::timeout(Duration::from_secs(2), closed.closed()).await;
                stream.mark_status_sent();
            }
            if let Ok((Some(job), client_ended)) = reader.await {
                let remaining = job.stream_closed();
                // The client gone while the reader waited (for room, or for
                // the writer to take its reply) ends the stream as its end does.
                let client_ended = client_ended || (!errored && closed.is_closed());
                if client_ended && !errored && remaining == 0 {
                    tokio::spawn(reclaim_when_abandoned(state, job));
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }

    async fn wait_queue_done(
        &self,
        request: Request<WaitQueueDoneRequest>,
    ) -> Result<Response<WaitQueueDoneResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.contexts.get(&tenant.key, req.context_id)?;
        // Requests run in order: a sync item answers once everything before it ran.
        job.run(vec![Item::Sync]).await?;
        Ok(Response::new(WaitQueueDoneResponse {}))
    }

    async fn run_component_function(
        &self,
        request: Request<RunComponentFunctionRequest>,
    ) -> Result<Response<RunComponentFunctionResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        self.state.contexts.get(&tenant.key, req.context_id)?;
        let name = req.operation.map(|o| o.name).unwrap_or_default();
        Err(Error::Unimplemented(format!(
            "RunComponentFunction ({name}): this function was split between the client's devices and the Salus \
             server, which cannot reach the client; Salus runs whole functions on the server. Build the \
             tf.function and its inputs under the server's device scope (the default once connected), not \
             inside `with tf.device(\"/job:localhost\")`"
        ))
        .into())
    }

    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<KeepAliveResponse>, Status> {
        let tenant = tenant_of(&request);
        let job = self
            .state
            .contexts
            .get(&tenant.key, request.into_inner().context_id)?;
        Ok(Response::new(KeepAliveResponse {
            context_view_id: job.context_view_id,
        }))
    }

    async fn close_context(
        &self,
        request: Request<CloseContextRequest>,
    ) -> Result<Response<CloseContextResponse>, Status> {
        // Closing an unknown context succeeds, as in TensorFlow's worker.
        let tenant = tenant_of(&request);
        if let Some(job) = self
            .state
            .contexts
            .remove(&tenant.key, request.into_inner().context_id)
        {
            let end = job.end_when_closed();
            self.state
                .close_context(job, "the client closed it", end)
                .await;
        }
        Ok(Response::new(CloseContextResponse {}))
    }
}

/// Reads a stream's requests in order and queues each on its context at once
/// (pipelined: the client does not wait for responses), as long as the
/// context has room (`EagerJob::admit`) and the stream's unanswered requests
/// are fewer than [`MAX_BATCHES_IN_FLIGHT`]; else it reads no further until
/// they are, and HTTP/2 flow control holds the client's sends. Returns the
/// context and whether the client ended the stream.
async fn read_stream(
    state: Arc<ServerState>,
    tenant: Arc<Tenant>,
    mut inbound: Streaming<EnqueueRequest>,
    pending: mpsc::Sender<PendingReply>,
    stream: Arc<StreamState>,
) -> (Option<Arc<EagerJob>>, bool) {
    let mut job: Option<Arc<EagerJob>> = None;
    loop {
        let req = match inbound.message().await {
            Ok(Some(req)) => req,
            Ok(None) | Err(_) => return (job, true),
        };
        if stream.failed.load(Ordering::SeqCst) {
            tracing::trace!(
                context = req.context_id,
                stream = stream.id,
                "a request after the stream failed: not run"
            );
            return (job, false);
        }
        let resolved = (|| {
            let current =
                match &job {
                    Some(j) if j.context_id == req.context_id => {
                        j.touch();
                        j.clone()
                    }
                    Some(_) => return Err(Error::InvalidArgument(
                        "StreamingEnqueue: every request of one stream must name the same context"
                            .into(),
                    )),
                    None => {
                        let j = state.contexts.get(&tenant.key, req.context_id)?;
                        j.stream_opened(&stream);
                        job = Some(j.clone());
                        j
                    }
                };
            let items = queue_items(req.queue)?;
            tracing::trace!(context = req.context_id, stream = stream.id,
                            items = ?items.iter().map(Item::label).collect::<Vec<_>>(), "stream request");
            Ok((current, items))
        })();
        let submitted = match resolved {
            Ok((current, items)) => {
                // While it waits for room the stream is not read; the writer
                // ending (the client gone) ends the wait.
                let admitted = tokio::select! {
                    admitted = current.admit() => admitted,
                    () = pending.closed() => return (job, false),
                };
                match admitted {
                    Ok(admitted) => current.submit(items, Some(stream.clone()), admitted),
                    Err(err) => Err(err),
                }
            }
            Err(err) => Err(err),
        };
        let stop = submitted.is_err();
        if pending.send(submitted).await.is_err() || stop {
            return (job, false);
        }
    }
}

/// Answers a stream's requests in order; the first error ends the stream with
/// its status, as TensorFlow's worker does, and so does the server ending the
/// stream ahead of its pending replies (`StreamState::end`). Returns whether
/// it ended in error.
async fn write_stream(
    mut pending: mpsc::Receiver<PendingReply>,
    out: mpsc::Sender<Result<EnqueueResponse, Status>>,
    stream: &StreamState,
) -> bool {
    loop {
        let reply = tokio::select! {
            reply = pending.recv() => match reply {
                Some(reply) => reply,
                None => return false,
            },
            reason = stream.ended() => Err(Error::Aborted(reason)),
            // The client is gone (it cancelled the call or its connection
            // dropped): nothing more to answer, and the reader, which may be
            // waiting for room, stops too.
            () = out.closed() => return false,
        };
        let outcome = match reply {
            Ok(rx) => tokio::select! {
                outputs = rx => outputs.unwrap_or_else(|_| {
                    Err(Error::ContextGone(
                        "eager context not found: it was closed while the request ran".into(),
                    ))
                }),
                reason = stream.ended() => Err(Error::Aborted(reason)),
                () = out.closed() => return false,
            },
            Err(err) => Err(err),
        };
        match outcome {
            Ok(outputs) => {
                if out.send(Ok(enqueue_response(outputs))).await.is_err() {
                    return false;
                }
            }
            Err(err) => {
                let _ = out.send(Err(err.into())).await;
                return true;
            }
        }
    }
}

/// Reclaims a context once its client is gone: no stream open and no request
/// for [`STREAM_END_GRACE`], and nothing running.
async fn reclaim_when_abandoned(state: Arc<ServerState>, job: Arc<EagerJob>) {
    loop {
        tokio::time::sleep(STREAM_END_GRACE).await;
        if job.open_streams() > 0 || !state.contexts.holds(&job) {
            return;
        }
        if job.idle_for() >= STREAM_END_GRACE && !job.is_busy() {
            state.count_reclaimed(true);
            let end = job.end_when_closed();
            state
                .close_context(job, "its client's stream ended", end)
                .await;
            return;
        }
    }
}

#[derive(Clone)]
pub struct Worker {
    state: Arc<ServerState>,
}

impl Worker {
    pub fn new(state: Arc<ServerState>) -> Worker {
        Worker { state }
    }
}

#[tonic::async_trait]
impl WorkerService for Worker {
    async fn get_status(
        &self,
        _: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, Status> {
        // Local names; the client renames them after the task it asked.
        Ok(Response::new(GetStatusResponse {
            device_attributes: device_attributes(&self.state.devices, str::to_string),
        }))
    }

    async fn recv_tensor(
        &self,
        request: Request<RecvTensorRequest>,
    ) -> Result<Response<RecvTensorResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        // Remote-eager pulls carry the context id as their step id; another
        // tenant's context is not found, so neither are its tensors.
        let job = self.state.contexts.get(&tenant.key, req.step_id as u64)?;
        let name = tensor_name(&req.rendezvous_key)?;
        tracing::trace!(context = req.step_id as u64, name, "pull");
        let sent = job.recv(name, UNANNOUNCED_GRACE).await;
        tracing::trace!(
            context = req.step_id as u64,
            name,
            ok = sent.is_ok(),
            "pull answered"
        );
        let sent = sent?;
        Ok(Response::new(RecvTensorResponse {
            tensor: Some(sent.tensor),
            is_dead: false,
            send_start_micros: sent.sent_micros,
            ..Default::default()
        }))
    }
}

/// TensorFlow's job names: a letter, then letters, digits and '_'.
fn is_job_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The tensor name of a rendezvous key
/// `src_device;src_incarnation;dst_device;tensor_name;frame:iter`.
pub fn tensor_name(key: &str) -> Result<&str> {
    let parts: Vec<&str> = key.split(';').collect();
    match parts.as_slice() {
        [_, _, _, name, _] if !name.is_empty() => Ok(name),
        _ => Err(Error::InvalidArgument(format!(
            "RecvTensor: malformed rendezvous key {key:?}; expected \
             src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ended_stream_answers_aborted_ahead_of_a_reply_that_never_comes() {
        let (pending_tx, pending_rx) = mpsc::channel::<PendingReply>(4);
        let (out_tx, mut out_rx) = mpsc::channel(4);
        let (never, stalled) = oneshot::channel();
        pending_tx.send(Ok(stalled)).await.unwrap();
        let stream = Arc::new(StreamState::new());
        let writer = tokio::spawn({
            let stream = stream.clone();
            async move { write_stream(pending_rx, out_tx, &stream).await }
        });
        tokio::task::yield_now().await;
        stream.end("nothing can answer".into());
        assert!(writer.await.unwrap(), "the stream ends in error");
        let status = out_rx.recv().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert_eq!(status.message(), "nothing can answer");
        drop(never);
    }

    #[tokio::test]
    async fn a_writer_waiting_for_a_reply_ends_when_its_client_is_gone() {
        // The reader may wait for room behind this writer: the client going
        // away (the transport drops the response stream) must end both.
        let (pending_tx, pending_rx) = mpsc::channel::<PendingReply>(1);
        let (out_tx, out_rx) = mpsc::channel(4);
        let (never, stalled) = oneshot::channel();
        pending_tx.send(Ok(stalled)).await.unwrap();
        let stream = Arc::new(StreamState::new());
        let writer = tokio::spawn({
            let stream = stream.clone();
            async move { write_stream(pending_rx, out_tx, &stream).await }
        });
        // A reader that fills the pending channel and then waits for room.
        let reader = tokio::spawn(async move {
            let mut unanswered = Vec::new();
            loop {
                let (tx, rx) = oneshot::channel();
                unanswered.push(tx);
                if pending_tx.send(Ok(rx)).await.is_err() {
                    return true;
                }
            }
        });
        tokio::task::yield_now().await;
        drop(out_rx);
        let errored = tokio::time::timeout(Duration::from_secs(5), writer).await;
        assert!(!errored.expect("the writer ends").unwrap(), "not an error: the client left");
        let unblocked = tokio::time::timeout(Duration::from_secs(5), reader).await;
        assert!(unblocked.expect("the reader's wait ends").unwrap());
        drop(never);
    }

    #[test]
    fn job_names_follow_tensorflow() {
        assert!(is_job_name("worker") && is_job_name("job_2"));
        assert!(
            !is_job_name("") && !is_job_name("a/b") && !is_job_name("2x") && !is_job_name("a:b")
        );
    }

    #[test]
    fn reads_tensor_names_from_rendezvous_keys() {
        let key = "/job:worker/replica:0/task:0/device:CPU:0;82c5df4e6707a1e6;/job:localhost/replica:0/task:0/device:CPU:0;7530058048480271776_3;0:0";
        assert_eq!(tensor_name(key).unwrap(), "7530058048480271776_3");
        assert!(tensor_name("a;b;c").is_err());
        assert!(tensor_name("a;b;c;;d").is_err());
    }
}
