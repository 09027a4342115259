//! `salus.v1.Admin`: what the server is doing, for operators and tools.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use salus_proto::salus::v1::admin_server::Admin;
use salus_proto::salus::v1::*;
use tonic::{Request, Response, Status};

use crate::state::ServerState;

pub struct AdminService {
    state: Arc<ServerState>,
}

impl AdminService {
    pub fn new(state: Arc<ServerState>) -> AdminService {
        AdminService { state }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        let s = &self.state;
        Ok(Response::new(ServerInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            tensorflow_version: s.tensorflow_version.clone(),
            devices: s
                .devices
                .iter()
                .map(|d| Device {
                    name: d.name.clone(),
                    device_type: d.device_type.clone(),
                    memory_limit_bytes: d.memory_bytes,
                })
                .collect(),
            open_sessions: s.sessions.len() as u64,
            sessions_created: s.sessions.sessions_created(),
            runs_completed: s.runs_completed(),
            uptime_seconds: s.started.elapsed().as_secs_f64(),
        }))
    }

    async fn list_sessions(
        &self,
        _: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        // graph_nodes walks the graph under TF's lock: cheap, but keep it off the runtime.
        let state = self.state.clone();
        let sessions = crate::exec::blocking(move || {
            Ok(state
                .sessions
                .all()
                .iter()
                .map(|job| SessionInfo {
                    handle: job.handle.clone(),
                    name: job.name.clone(),
                    graph_version: job.graph_version(),
                    graph_nodes: job.graph_nodes() as u64,
                    runs_completed: job.stats.runs_completed.load(Ordering::Relaxed),
                    runs_failed: job.stats.runs_failed.load(Ordering::Relaxed),
                    open_callables: job.open_callables() as u64,
                    age_seconds: job.created.elapsed().as_secs_f64(),
                    idle_seconds: job.idle_seconds(),
                })
                .collect())
        })
        .await?;
        Ok(Response::new(ListSessionsResponse { sessions }))
    }
}
