//! `tensorflow.MasterService`: the protocol stock TensorFlow clients speak.
//!
//! Each handler looks the session up, then does all TensorFlow work (tensor
//! conversion included) on an executor thread via [`exec::blocking`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use salus_proto::tensorflow::master_service_server::MasterService;
use salus_proto::tensorflow::*;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::frontend::identify::tenant_of;
use crate::runtime::exec;
use crate::runtime::graph_job::{Job, RunClass, RunKey};
use crate::runtime::session_config::session_config;
use crate::runtime::state::ServerState;
use crate::runtime::timeline::JobKind;
use crate::sched::Hints;
use crate::tf::Tensor;

pub struct Master {
    state: Arc<ServerState>,
}

impl Master {
    pub fn new(state: Arc<ServerState>) -> Master {
        Master { state }
    }

    /// Runs `f` (a job's run) through the one main iteration: now if it is
    /// cheap, else when the scheduler picks it.
    async fn dispatch<T, F>(
        &self,
        job: &Job,
        class: RunClass,
        deadline: Option<Instant>,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        self.state
            .iterations
            .run(job.iterating(), class, deadline, || job.fingerprint(), f)
            .await
    }
}

/// The call's deadline from the `grpc-timeout` header, if the client set one.
fn grpc_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    Some(Instant::now() + parse_grpc_timeout(text)?)
}

/// Parses gRPC's `TimeoutValue TimeoutUnit` ("100m", "5S", "30u", ...).
fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    if text.len() < 2 || text.len() > 9 {
        return None;
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.checked_mul(3600)?),
        "M" => Duration::from_secs(value.checked_mul(60)?),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// Converts fetched tensors to protos, naming each failure after its fetch.
fn fetched_protos(tensors: Vec<Tensor>, names: &[String]) -> Result<Vec<TensorProto>> {
    tensors
        .into_iter()
        .zip(names)
        .map(|(t, name)| t.into_proto().map_err(|e| Error::tensor(name, e)))
        .collect()
}

/// The body of RunStep: a full run or one step of a partial run.
fn run_step(
    state: &ServerState,
    job: &Job,
    req: &RunStepRequest,
    key: RunKey,
) -> Result<RunStepResponse> {
    let feeds = job.feeds(
        req.feed
            .iter()
            .map(|f| (f.name.as_str(), f.tensor.as_ref())),
    )?;
    let (tensors, metadata) = if req.partial_run_handle.is_empty() {
        let fetches = req
            .fetch
            .iter()
            .map(|n| job.port(n, "fetch"))
            .collect::<Result<Vec<_>>>()?;
        let targets = req
            .target
            .iter()
            .map(|n| job.target(n))
            .collect::<Result<Vec<_>>>()?;
        let out = job.run(key, &req.options, &feeds, &fetches, &targets)?;
        (out.outputs, out.metadata)
    } else {
        (
            job.partial_run(&req.partial_run_handle, &feeds, &req.fetch, &req.target)?,
            Vec::new(),
        )
    };
    state.count_run();
    let tensor = fetched_protos(tensors, &req.fetch)?
        .into_iter()
        .zip(&req.fetch)
        .map(|(tensor, name)| NamedTensorProto {
            name: name.clone(),
            tensor: Some(tensor),
        })
        .collect();
    Ok(RunStepResponse {
        tensor,
        metadata: metadata.into(),
        ..Default::default()
    })
}

#[tonic::async_trait]
impl MasterService for Master {
    async fn create_session(
        &self,
        request: Request<CreateSessionRequest>,
    ) -> Result<Response<CreateSessionResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let (config, metadata_name) = session_config(&req.config, self.state.session_defaults)?;
        let hints = Hints::parse(&metadata_name).map_err(Error::from)?;
        let opening = self
            .state
            .begin_job(JobKind::Graph, tenant.as_ref(), &hints.name)
            .await?;
        let (id, handle) = (opening.id(), opening.handle.clone());
        let job = {
            let handle = handle.clone();
            let hints = hints.clone();
            let settings = self.state.settings;
            let rules = self.state.rules_for(&tenant);
            let gpu_lane = opening.gpu_lane;
            exec::blocking(move || {
                Job::create(
                    id,
                    handle,
                    hints,
                    &req.graph_def,
                    &config,
                    settings,
                    gpu_lane,
                    rules,
                )
            })
            .await?
        };
        opening
            .open(Arc::new(job), hints.clone(), |job| {
                self.state.insert_session(tenant.clone(), job)
            })
            .await?;
        tracing::info!(session = %handle, job = id.0, name = %hints.name, tenant = %tenant, ?hints, "session created");
        Ok(Response::new(CreateSessionResponse {
            session_handle: handle,
            graph_version: 0,
        }))
    }

    async fn extend_session(
        &self,
        request: Request<ExtendSessionRequest>,
    ) -> Result<Response<ExtendSessionResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.sessions.get(&req.session_handle, &tenant.key)?;
        let new_graph_version =
            exec::blocking(move || job.extend(&req.graph_def, req.current_graph_version)).await?;
        Ok(Response::new(ExtendSessionResponse { new_graph_version }))
    }

    async fn partial_run_setup(
        &self,
        request: Request<PartialRunSetupRequest>,
    ) -> Result<Response<PartialRunSetupResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.sessions.get(&req.session_handle, &tenant.key)?;
        let partial_run_handle =
            exec::blocking(move || job.partial_run_setup(&req.feed, &req.fetch, &req.target))
                .await?;
        Ok(Response::new(PartialRunSetupResponse {
            partial_run_handle,
        }))
    }

    async fn run_step(
        &self,
        request: Request<RunStepRequest>,
    ) -> Result<Response<RunStepResponse>, Status> {
        let deadline = grpc_deadline(request.metadata());
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let store_errors = req.store_errors_in_response_body;
        let result = match self.state.sessions.get(&req.session_handle, &tenant.key) {
            Ok(job) => {
                let _busy = job.busy();
                let feed_names: Vec<&str> = req.feed.iter().map(|f| f.name.as_str()).collect();
                let key = RunKey::of_step(&feed_names, &req.fetch, &req.target);
                // Steps of a partial run are not iterations of their own.
                let class = if req.partial_run_handle.is_empty() {
                    job.classify(key, req.fetch.iter().chain(&req.target).map(String::as_str))
                } else {
                    RunClass::Cheap
                };
                let state = self.state.clone();
                let run_job = job.clone();
                self.dispatch(&job, class, deadline, move || {
                    run_step(&state, &run_job, &req, key)
                })
                .await
            }
            Err(err) => Err(err),
        };
        match result {
            Ok(response) => Ok(Response::new(response)),
            // The stock client asks for runtime errors in the body, with gRPC OK.
            Err(err) if store_errors => Ok(Response::new(RunStepResponse {
                status_code: err.code() as i32,
                status_error_message: err.to_string(),
                ..Default::default()
            })),
            Err(err) => Err(err.into()),
        }
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let tenant = tenant_of(&request);
        let handle = request.into_inner().session_handle;
        let job = self.state.sessions.remove(&handle, &tenant.key)?;
        self.state
            .sched
            .end_job(job.id, job.history.end_when_closed());
        if let Some(admission) = &self.state.admission {
            admission.withdraw(job.id);
        }
        // The TF session closes when the last reference goes; do that off the runtime.
        exec::drop_off_runtime(job).await?;
        tracing::info!(session = %handle, "session closed");
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn list_devices(
        &self,
        request: Request<ListDevicesRequest>,
    ) -> Result<Response<ListDevicesResponse>, Status> {
        let tenant = tenant_of(&request);
        let handle = request.into_inner().session_handle;
        if !handle.is_empty() {
            self.state.sessions.get(&handle, &tenant.key)?;
        }
        let local_device = self
            .state
            .devices
            .iter()
            .map(|d| DeviceAttributes {
                name: d.name.clone(),
                device_type: d.device_type.clone(),
                memory_limit: d.memory_bytes,
                incarnation: d.incarnation,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(ListDevicesResponse {
            local_device,
            remote_device: Vec::new(),
        }))
    }

    async fn reset(
        &self,
        request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        if !req.device_filters.is_empty() {
            tracing::warn!(filters = ?req.device_filters, "Reset ignores device_filters: containers are cleared on every device");
        }
        // Reset clears the containers of the caller's own sessions: other
        // tenants' state is not theirs to clear.
        tracing::info!(containers = ?req.container, tenant = %tenant, "resetting resource containers of the tenant's open sessions");
        let jobs = self.state.sessions.of_tenant(&tenant.key);
        exec::blocking(move || {
            for job in jobs {
                let kept = job.reset_containers(&req.container)?;
                if !kept.is_empty() {
                    tracing::warn!(session = %job.handle, nodes = ?kept, "Reset cannot clear reference-typed state; close the session to free it");
                }
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(ResetResponse {}))
    }

    async fn make_callable(
        &self,
        request: Request<MakeCallableRequest>,
    ) -> Result<Response<MakeCallableResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.sessions.get(&req.session_handle, &tenant.key)?;
        let options = req.options.unwrap_or_default();
        let handle = exec::blocking(move || job.make_callable(&options)).await?;
        Ok(Response::new(MakeCallableResponse { handle }))
    }

    async fn run_callable(
        &self,
        request: Request<RunCallableRequest>,
    ) -> Result<Response<RunCallableResponse>, Status> {
        let deadline = grpc_deadline(request.metadata());
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.sessions.get(&req.session_handle, &tenant.key)?;
        let _busy = job.busy();
        let class = job.classify_callable(req.handle);
        let state = self.state.clone();
        let run_job = job.clone();
        let response = self
            .dispatch(&job, class, deadline, move || {
                let job = run_job;
                let out = job.run_callable(req.handle, &req.feed)?;
                state.count_run();
                let fetch = out
                    .outputs
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        t.into_proto().map_err(|e| {
                            Error::tensor(format!("fetch {i} of callable {}", req.handle), e)
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(RunCallableResponse {
                    fetch,
                    metadata: out.metadata.into(),
                })
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn release_callable(
        &self,
        request: Request<ReleaseCallableRequest>,
    ) -> Result<Response<ReleaseCallableResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let job = self.state.sessions.get(&req.session_handle, &tenant.key)?;
        job.release_callable(req.handle)?;
        Ok(Response::new(ReleaseCallableResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("30u"), Some(Duration::from_micros(30)));
        for bad in ["", "m", "10x", "-5S", "1234567890S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }
}
