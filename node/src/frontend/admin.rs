//! `salus.v1.Admin`: what the server is doing, for operators and tools.
//!
//! Scoped by tenant: a tenant sees and changes only its own jobs (rows,
//! hints, timeline spans); admins (`tenant::admins`) see and change every
//! tenant's, and alone may change the policy. Server-wide figures
//! (`GetServerInfo`, `GetStats`) are aggregates, open to every tenant.

use std::sync::Arc;

use salus_proto::salus::v1::admin_server::Admin;
use salus_proto::salus::v1::*;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::frontend::history;
use crate::frontend::identify::tenant_of;
use crate::runtime::admission::Admission;
use crate::runtime::executor::{Executor, TenantFigures};
use crate::runtime::grants::RuntimeGrants;
use crate::runtime::job_source::{JobCounters, JobSource, Viewer};
use crate::runtime::latency::LatencySnapshot;
use crate::runtime::node::Node;
use crate::runtime::report::Rows;
use crate::runtime::settings::{hints_key, DrainRecord, ReloadReport, SavedHints};
use crate::sched::tenants::MAX_WEIGHT;
use crate::sched::{Hints, JobId};
use crate::tenant::admins::Admins;
use crate::tenant::grants::{self, token_tenant};
use crate::tenant::identity::Identifier;
use crate::tenant::identity::Tenant;
use crate::tenant::limits::Limits;
use crate::tenant::tokens;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone)]
pub struct AdminService {
    /// The scheduler core (this process schedules: the admin API is served
    /// where the core is), memory admission and devices.
    core: Executor,
    node: Arc<Node>,
    /// The jobs: this process's, or the tenants' executors' (the supervisor).
    jobs: Arc<dyn JobSource>,
    /// Who tenants are; its store of tokens issued at run time (None: this
    /// process issues none).
    identifier: Option<Arc<Identifier>>,
}

impl AdminService {
    /// The admin API of `node`, whose jobs `jobs` gives; None where the node
    /// schedules nothing (a tenant's executor: its supervisor serves it).
    pub fn new(node: Arc<Node>, jobs: Arc<dyn JobSource>) -> Option<AdminService> {
        Some(AdminService {
            core: node.sched.core()?.clone(),
            node,
            jobs,
            identifier: None,
        })
    }

    /// The scheduler core this service administers.
    pub fn core(&self) -> &Executor {
        &self.core
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Who tenants are (None: no identifier was given).
    pub fn identifier(&self) -> Option<&Arc<Identifier>> {
        self.identifier.as_ref()
    }

    /// The scheduler and memory admission as the holder of tenants' grants.
    fn grant_holder(&self) -> RuntimeGrants {
        RuntimeGrants {
            executor: self.core.clone(),
            admission: self.node.admission.clone(),
        }
    }

    /// Who may act on every tenant's jobs (`--admins`, besides the server's
    /// own user and root). Kept in the node's settings: a reload replaces them
    /// for every clone of this service.
    pub fn with_admins(self, admins: Admins) -> AdminService {
        self.node.settings.set_admins(admins);
        self
    }

    /// Issues tokens into `identifier`'s store, and forgets expired ones
    /// (with the limits they gave) every few seconds.
    pub fn with_identifier(mut self, identifier: Arc<Identifier>) -> AdminService {
        let jobs = self.jobs.clone();
        grants::sweep_expired(
            Arc::downgrade(&identifier),
            Arc::new(self.grant_holder()),
            move |identifier, token, now| {
                end_connections(&*jobs, identifier, token, now, "its token expired")
            },
        );
        self.identifier = Some(identifier);
        self
    }

    /// The caller, if an admin; PERMISSION_DENIED naming `what` otherwise.
    fn admin_only<T>(&self, request: &Request<T>, what: &str) -> Result<Arc<Tenant>, Status> {
        let caller = tenant_of(request);
        if self.viewer(&caller) != Viewer::Admin {
            return Err(Error::PermissionDenied(format!(
                "{what} needs an admin ({}); tenant {caller} is not one",
                self.node.settings.admins().describe()
            ))
            .into());
        }
        Ok(caller)
    }

    fn history_asker<'a>(&self, caller: &'a Tenant) -> history::Asker<'a> {
        match self.viewer(caller) {
            Viewer::Admin => history::Asker::Admin,
            Viewer::Tenant(_) => history::Asker::Tenant(caller),
        }
    }

    fn token_store(&self) -> Result<&Arc<Identifier>, Status> {
        self.identifier.as_ref().ok_or_else(|| {
            Error::FailedPrecondition(
                "this process issues no tokens: ask the server's listening address".into(),
            )
            .into()
        })
    }

    fn viewer(&self, caller: &Tenant) -> Viewer {
        if self.node.settings.admins().allows(caller) {
            Viewer::Admin
        } else {
            Viewer::Tenant(caller.key.clone())
        }
    }

    /// Version, devices and server-wide counters (`GetServerInfo`). Blocks:
    /// call it off the async runtime.
    pub fn server_info(&self) -> ServerInfo {
        self.server_info_from(self.jobs.gather(&self.node, None).counters)
    }

    /// The server's counters and every job from one look at the jobs
    /// (`/metrics`: one report per executor per scrape). Blocks: call it off
    /// the async runtime.
    pub fn snapshot(&self) -> (ServerInfo, Vec<JobInfo>) {
        let gathered = self.jobs.gather(&self.node, Some(&Viewer::Admin));
        (
            self.server_info_from(gathered.counters),
            self.with_scheduler_view(gathered.rows),
        )
    }

    fn server_info_from(&self, counters: JobCounters) -> ServerInfo {
        ServerInfo {
            isolation: counters.isolation.into(),
            executors_running: counters.executors.running,
            executors_started: counters.executors.started,
            executors_failed: counters.executors.failed,
            executors: counters.executor_list,
            open_sessions: counters.open_sessions,
            open_eager_contexts: counters.open_eager_contexts,
            sessions_created: counters.sessions_created,
            runs_completed: counters.runs_completed,
            heap_in_use_bytes: counters.heap_in_use_bytes,
            sessions_reclaimed: counters.sessions_reclaimed,
            eager_contexts_reclaimed: counters.eager_contexts_reclaimed,
            run_errors: counters.run_errors,
            ..self.node_info()
        }
    }

    /// The jobs `viewer` sees, by id, with this process's scheduler view.
    /// Blocks: call it off the async runtime.
    fn jobs_for(&self, viewer: &Viewer) -> Vec<JobInfo> {
        self.with_scheduler_view(self.jobs.gather(&self.node, Some(viewer)).rows)
    }

    /// `rows` by id, each with the scheduler's and memory admission's view
    /// from this process (an executor's rows carry only its own columns).
    fn with_scheduler_view(&self, rows: Vec<JobInfo>) -> Vec<JobInfo> {
        let mut rows: Vec<JobInfo> = rows
            .into_iter()
            .map(|row| Rows(&self.node).with_scheduler_view(row))
            .collect();
        rows.sort_by_key(|j| j.id);
        rows
    }

    /// What the node knows of itself; the job counters are the caller's.
    fn node_info(&self) -> ServerInfo {
        let s = &self.node;
        let admission = s.admission.as_ref().map(|a| a.counts()).unwrap_or_default();
        ServerInfo {
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
            uptime_seconds: s.started.elapsed().as_secs_f64(),
            policy: self.core.policy_name().into(),
            memory_capacity_bytes: s.admission.as_ref().map_or(0, |a| a.capacity()),
            memory_free_bytes: s.admission.as_ref().map_or(0, |a| a.free()),
            memory_reserved_bytes: s.admission.as_ref().map_or(0, |a| a.reserved().0),
            memory_held_back_bytes: s.admission.as_ref().map_or(0, |a| a.reserved().1),
            memory_capacity_source: s.capacity_source.as_str().into(),
            cuda_gpu0: Some(cuda_device(&s.gpu)),
            memory_lanes: s
                .admission
                .as_ref()
                .map(|a| a.lanes())
                .unwrap_or_default()
                .into_iter()
                .map(|l| MemoryLane {
                    lane: l.id.0,
                    size_bytes: l.size,
                    used_bytes: l.used,
                    jobs: l.jobs.iter().map(|j| j.0).collect(),
                })
                .collect(),
            admission_waits: admission.waits,
            admission_refusals: admission.refusals,
            admission_timeouts: admission.timeouts,
            draining: s.settings.drain().is_some(),
            draining_since_unix_seconds: s.settings.drain().map_or(0.0, |d| d.since_unix_s as f64),
            config_file: s
                .settings
                .configured()
                .loaded
                .file
                .map(|f| f.display().to_string())
                .unwrap_or_default(),
            // The job counters: filled in by `server_info_from`.
            ..Default::default()
        }
    }

    /// Every open job, by id (`ListJobs`; `/metrics` reads it too). Blocks:
    /// call it off the async runtime.
    pub fn jobs(&self) -> Vec<JobInfo> {
        self.jobs_for(&Viewer::Admin)
    }

    /// Scheduler statistics, every tenant's row included (`/metrics`).
    pub fn scheduler_stats(&self) -> SchedulerStats {
        self.scheduler_stats_for(&Viewer::Admin)
    }

    /// Scheduler statistics with the tenant rows `viewer` sees (`GetStats`).
    fn scheduler_stats_for(&self, viewer: &Viewer) -> SchedulerStats {
        let stats = self.core.stats();
        SchedulerStats {
            policy: stats.policy.into(),
            iterations_total: stats.iterations_total,
            iterations_per_second: stats.iterations_per_second,
            queued: stats.queued,
            switch_latency: Some(latency_summary(&stats.switch_latency)),
            handover_latency: Some(latency_summary(&stats.handover_latency)),
            lanes: stats
                .lanes
                .iter()
                .map(|&(lane, queued, running)| LaneQueue {
                    lane: lane.0,
                    queued,
                    running,
                })
                .collect(),
            cheap_runs_total: stats.cheap_runs_total,
            dropped_iterations: stats.dropped_iterations,
            lane_holds_released: stats.lane_holds_released,
            iteration_time: Some(latency_summary(&stats.runs.iteration_time)),
            queue_wait: Some(latency_summary(&stats.runs.queue_wait)),
            share: stats.share.name().into(),
            tenants: {
                let memory = self
                    .node
                    .admission
                    .as_ref()
                    .map(Admission::claimed_by_tenant)
                    .unwrap_or_default();
                self.core
                    .tenant_figures()
                    .iter()
                    .filter(|figures| viewer.sees(&figures.tenant.key))
                    .map(|figures| {
                        tenant_share(
                            figures,
                            memory.get(&figures.status.id).copied().unwrap_or(0),
                        )
                    })
                    .collect()
            },
        }
    }
}

impl AdminService {
    /// The drain in force and every open job. Gathers the jobs off the runtime.
    async fn drain_status(&self) -> Result<DrainStatus, Status> {
        let this = self.clone();
        let jobs =
            crate::runtime::exec::blocking(move || Ok(this.jobs_for(&Viewer::Admin))).await?;
        let drain = self.node.settings.drain();
        Ok(DrainStatus {
            draining: drain.is_some(),
            since_unix_seconds: drain.as_ref().map_or(0.0, |d| d.since_unix_s as f64),
            until_restart: drain.as_ref().is_some_and(|d| d.until_restart),
            by: drain.map(|d| d.by).unwrap_or_default(),
            jobs,
        })
    }
}

fn reload_response(report: &ReloadReport) -> ReloadResponse {
    ReloadResponse {
        config_file: report.config_file.clone().unwrap_or_default(),
        tenants_file: report.tenants_file.clone().unwrap_or_default(),
        applied: report.applied.clone(),
        needs_restart: report.needs_restart.clone(),
        notes: report.notes.clone(),
    }
}

fn tenant_share(figures: &TenantFigures, memory_bytes: u64) -> TenantShare {
    TenantShare {
        tenant: figures.tenant.to_string(),
        tenant_name: figures.tenant.name.clone(),
        tenant_uid: figures.tenant.uid,
        weight: figures.status.weight,
        device_seconds: figures.status.service as f64 / 1e9,
        jobs: figures.status.jobs as u64,
        queued: figures.status.work as u64,
        limits: Some(limits_to_proto(&figures.limits)),
        memory_bytes,
        refusals: figures.refusals,
    }
}

impl AdminService {
    /// The memory reservations of issued tokens that `viewer` sees, by tenant.
    fn reservations_for(&self, viewer: &Viewer) -> Vec<Reservation> {
        let (Some(identifier), Some(admission)) = (&self.identifier, &self.node.admission) else {
            return Vec::new();
        };
        let claimed = admission.claimed_by_tenant();
        let now = SystemTime::now();
        let mut by_tenant: Vec<(Tenant, Vec<tokens::IssuedToken>)> = Vec::new();
        for token in identifier.issued().list() {
            if token.expired(now) || token.limits.memory.is_none() {
                continue;
            }
            match by_tenant
                .iter_mut()
                .find(|(_, tokens)| tokens[0].same_tenant(&token))
            {
                Some((_, tokens)) => tokens.push(token),
                None => by_tenant.push((token_tenant(&token), vec![token])),
            }
        }
        by_tenant
            .into_iter()
            .filter(|(tenant, _)| viewer.sees(&tenant.key))
            .map(|(tenant, tokens)| {
                let id = self.core.tenant_id(&tenant);
                let unix = |t: SystemTime| {
                    t.duration_since(UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64())
                };
                Reservation {
                    tenant: tenant.to_string(),
                    tenant_name: tenant.name.clone(),
                    tenant_uid: tenant.uid,
                    reserved_bytes: admission
                        .reserved_by_tenant([id])
                        .get(&id)
                        .copied()
                        .unwrap_or(0),
                    claimed_bytes: claimed.get(&id).copied().unwrap_or(0),
                    token_ids: tokens.iter().map(|t| t.id.clone()).collect(),
                    expires_unix_seconds: tokens
                        .iter()
                        .filter_map(|t| t.expires_at)
                        .min()
                        .map_or(0.0, unix),
                    jobs_started: self.core.jobs_opened(id),
                }
            })
            .collect()
    }
}

/// Ends the open connections and jobs of `gone`'s tenant (under `--isolation
/// tenant`, by stopping its executor) unless it can still be identified
/// otherwise.
fn end_connections(
    jobs: &dyn JobSource,
    identifier: &Identifier,
    gone: &tokens::IssuedToken,
    now: SystemTime,
    why: &str,
) {
    if !identifier.still_admits(gone, now) {
        jobs.stop_tenant(&token_tenant(gone).key, why);
    }
}

fn token_info(token: &tokens::IssuedToken) -> TokenInfo {
    let unix = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    TokenInfo {
        id: token.id.clone(),
        tenant: token.tenant.clone(),
        uid: token.uid,
        limits: Some(limits_to_proto(&token.limits)),
        issued_unix_seconds: unix(token.issued_at),
        expires_unix_seconds: token.expires_at.map_or(0.0, unix),
    }
}

fn limits_from_proto(limits: Option<TenantLimits>) -> Result<Limits, Status> {
    let asked = limits.unwrap_or_default();
    if let Some(weight) = asked.weight {
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(Error::InvalidArgument(format!(
                "a weight is 1 to {MAX_WEIGHT}, not {weight}"
            ))
            .into());
        }
    }
    Ok(Limits {
        weight: asked.weight,
        max_jobs: asked.max_jobs,
        max_priority: asked.max_priority,
        memory: asked.memory_bytes,
    })
}

fn limits_to_proto(limits: &Limits) -> TenantLimits {
    TenantLimits {
        weight: limits.weight,
        max_jobs: limits.max_jobs,
        max_priority: limits.max_priority,
        memory_bytes: limits.memory,
    }
}

fn latency_summary(l: &LatencySnapshot) -> LatencySummary {
    LatencySummary {
        count: l.count,
        p50_us: l.p50_us,
        p99_us: l.p99_us,
        max_us: l.max_us,
        buckets: l.buckets.clone(),
        sum_us: l.sum_us,
    }
}

impl AdminService {
    /// `SetJobHints`: the job found by id, handle or name among those
    /// `viewer` sees; the hints are the scheduler's, in this process.
    async fn set_job_hints_as(
        &self,
        req: SetJobHintsRequest,
        viewer: Viewer,
    ) -> Result<JobInfo, Status> {
        let this = self.clone();
        let seen = viewer.clone();
        let rows = crate::runtime::exec::blocking(move || {
            Ok(this.jobs.gather(&this.node, Some(&seen)).rows)
        })
        .await?;
        let key_id = req.job.parse::<u64>().ok();
        let row = rows
            .into_iter()
            .find(|j| Some(j.id) == key_id || j.handle == req.job || j.name == req.job)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{} has id, handle or name {:?}",
                    viewer.whose(),
                    req.job
                ))
            })?;
        let id = JobId(row.id);
        // A session listed before its first run has not joined the scheduler yet
        // (it has no id): a user's mistake to say plainly, not an internal error.
        if self.core.job_status(id).is_none() {
            return Err(Error::FailedPrecondition(format!(
                "job {:?} has not started running yet, so the scheduler has no hints of it to change: \
                 retry once it runs, or give hints in its job name (NAME?iterations=N)",
                req.job
            ))
            .into());
        }
        let hints = hints_from_request(&req, row.name.clone(), &self.core, id)?;
        self.core.set_hints(id, hints.clone())?;
        tracing::info!(job = id.0, ?hints, "job hints changed");
        // Kept by job identity: the job adopted after a restart, or submitted
        // again under its name, gets them back.
        if let Some(identity) = self.core.identity(id) {
            let key = hints_key(&identity.tenant, &identity.name);
            let settings = &self.node.settings;
            for forgotten in settings.record_hints(key.clone(), SavedHints::of(&hints)) {
                self.core.save_hints(forgotten, None);
            }
            self.core.save_hints(key, Some(SavedHints::of(&hints)));
            settings.persist_or_warn("job hints").await;
        }
        Ok(Rows(&self.node).with_scheduler_view(row))
    }
}

/// The hints a SetJobHints request gives `id`: the fields it sets replace the
/// job's, the rest (and the memory hints) are kept.
fn hints_from_request(
    req: &SetJobHintsRequest,
    name: String,
    core: &Executor,
    id: JobId,
) -> Result<Hints, Status> {
    let given = req.hints.unwrap_or_default();
    if let Some(seconds) = given.expected_seconds {
        if seconds < 0.0 || !seconds.is_finite() {
            return Err(Error::InvalidArgument(
                "expected_seconds must be a finite number >= 0 (0: none)".into(),
            )
            .into());
        }
    }
    let current = core.job_status(id).map(|s| s.hints).unwrap_or_default();
    Ok(merge_hints(current, &given, name))
}

/// `current` with the fields `given` sets replaced (0 clears an expectation).
fn merge_hints(current: Hints, given: &JobHintsUpdate, name: String) -> Hints {
    Hints {
        name,
        priority: given.priority.unwrap_or(current.priority),
        expected_iterations: match given.expected_iterations {
            Some(n) => (n > 0).then_some(n),
            None => current.expected_iterations,
        },
        expected_seconds: match given.expected_seconds {
            Some(s) => (s > 0.0).then_some(s),
            None => current.expected_seconds,
        },
        ..current
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        let this = self.clone();
        let info = crate::runtime::exec::blocking(move || Ok(this.server_info())).await?;
        Ok(Response::new(info))
    }

    async fn list_jobs(
        &self,
        request: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        let viewer = self.viewer(&tenant_of(&request));
        let this = self.clone();
        let (jobs, reservations) = crate::runtime::exec::blocking(move || {
            Ok((this.jobs_for(&viewer), this.reservations_for(&viewer)))
        })
        .await?;
        Ok(Response::new(ListJobsResponse { jobs, reservations }))
    }

    async fn get_stats(
        &self,
        request: Request<GetStatsRequest>,
    ) -> Result<Response<SchedulerStats>, Status> {
        let viewer = self.viewer(&tenant_of(&request));
        Ok(Response::new(self.scheduler_stats_for(&viewer)))
    }

    async fn set_tenant_limits(
        &self,
        request: Request<SetTenantLimitsRequest>,
    ) -> Result<Response<TenantLimits>, Status> {
        let caller = self.admin_only(&request, "changing a tenant's limits")?;
        let req = request.into_inner();
        let name = req.tenant.trim();
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "name the tenant (a user name, a tenants file name, anonymous) or * for the defaults"
                    .into(),
            )
            .into());
        }
        let limits = limits_from_proto(req.limits)?;
        let now = self.core.set_limits(name, &limits);
        tracing::info!(tenant = name, limits = %now, by = %caller, "tenant limits changed");
        // `salus limits NAME` with no field only shows them: nothing to keep.
        if limits != Limits::default() {
            self.node.settings.record_limits(name, &limits);
            self.node.settings.persist_or_warn("tenant limits").await;
        }
        Ok(Response::new(limits_to_proto(&now)))
    }

    async fn issue_token(
        &self,
        request: Request<IssueTokenRequest>,
    ) -> Result<Response<IssuedToken>, Status> {
        let caller = self.admin_only(&request, "issuing a token")?;
        let identifier = self.token_store()?;
        let req = request.into_inner();
        if !tokens::valid_tenant_name(&req.tenant) {
            return Err(Error::InvalidArgument(format!(
                "tenant name {:?}: use 1 to 64 letters, digits, - _ . @",
                req.tenant
            ))
            .into());
        }
        if !(req.expires_seconds.is_finite() && req.expires_seconds >= 0.0) {
            return Err(Error::InvalidArgument(format!(
                "expires_seconds must be 0 (never) or a positive number of seconds, not {}",
                req.expires_seconds
            ))
            .into());
        }
        let limits = limits_from_proto(req.limits)?;
        let uid = identifier
            .binding_for(&req.tenant, req.uid)
            .map_err(Error::InvalidArgument)?;
        if let Some(uid) = uid {
            if crate::tenant::users::Account::by_uid(uid).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "no Unix user has uid {uid} on this machine"
                ))
                .into());
            }
        }
        let lifetime =
            (req.expires_seconds > 0.0).then(|| Duration::from_secs_f64(req.expires_seconds));
        // Off the runtime: issuing saves the state file (a fsync).
        let issuing = identifier.clone();
        let tenant = req.tenant.clone();
        let (token, record) = tokio::task::spawn_blocking(move || {
            issuing.issued().issue(&tenant, uid, limits, lifetime)
        })
        .await
        .map_err(|e| Error::Internal(format!("issuing a token failed: {e}")))?
        .map_err(|e| Error::Internal(e.to_string()))?;
        let now = SystemTime::now();
        let holder = self.grant_holder();
        if let Err(err) = grants::apply(&holder, identifier.issued(), &record, now) {
            // The reservation does not fit: the token was never handed out.
            let revoking = identifier.clone();
            let id = record.id.clone();
            let _ = tokio::task::spawn_blocking(move || {
                revoking.issued().revoke(tokens::Revoke::Id(&id))
            })
            .await;
            grants::apply(&holder, identifier.issued(), &record, now)?;
            return Err(err.into());
        }
        tracing::info!(id = record.id, tenant = record.tenant, uid = ?record.uid, limits = %record.limits, expires_s = req.expires_seconds, by = %caller, "token issued");
        Ok(Response::new(IssuedToken {
            token,
            info: Some(token_info(&record)),
        }))
    }

    async fn revoke_tokens(
        &self,
        request: Request<RevokeTokensRequest>,
    ) -> Result<Response<ListTokensResponse>, Status> {
        let caller = self.admin_only(&request, "revoking a token")?;
        let identifier = self.token_store()?;
        let asked = request.into_inner();
        // A request of a client older than `id` and `tenant` names an id: a
        // bare word is never taken for a tenant's name.
        let (by_tenant, which) = match (
            asked.id.as_str(),
            asked.tenant.as_str(),
            asked.which.as_str(),
        ) {
            (id, "", "") if !id.is_empty() => (false, id.to_string()),
            ("", tenant, "") if !tenant.is_empty() => (true, tenant.to_string()),
            ("", "", id) if !id.is_empty() => (false, id.to_string()),
            _ => {
                return Err(Error::InvalidArgument(
                    "name exactly one of a token id (--id) and a tenant (--tenant) to revoke"
                        .into(),
                )
                .into())
            }
        };
        // Off the runtime: revoking saves the state file (a fsync).
        let revoking = identifier.clone();
        let asked = which.clone();
        let revoked = tokio::task::spawn_blocking(move || {
            revoking.issued().revoke(if by_tenant {
                tokens::Revoke::Tenant(&asked)
            } else {
                tokens::Revoke::Id(&asked)
            })
        })
        .await
        .map_err(|e| Error::Internal(format!("revoking failed: {e}")))?;
        if revoked.is_empty() {
            let why = if by_tenant {
                format!("no issued token is of tenant {which:?}")
            } else {
                format!("no issued token has id {which:?} (a tenant's tokens are revoked with --tenant NAME)")
            };
            return Err(Error::InvalidArgument(format!(
                "{why} (tokens of the tenants file are revoked by editing it)"
            ))
            .into());
        }
        let now = SystemTime::now();
        let holder = self.grant_holder();
        for token in &revoked {
            tracing::info!(id = token.id, tenant = token.tenant, by = %caller, "token revoked");
            grants::apply(&holder, identifier.issued(), token, now)?;
            end_connections(&*self.jobs, identifier, token, now, "its token was revoked");
        }
        Ok(Response::new(ListTokensResponse {
            tokens: revoked.iter().map(token_info).collect(),
        }))
    }

    async fn list_tokens(
        &self,
        request: Request<ListTokensRequest>,
    ) -> Result<Response<ListTokensResponse>, Status> {
        self.admin_only(&request, "listing tokens")?;
        let identifier = self.token_store()?;
        Ok(Response::new(ListTokensResponse {
            tokens: identifier.issued().list().iter().map(token_info).collect(),
        }))
    }

    async fn list_history(
        &self,
        request: Request<ListHistoryRequest>,
    ) -> Result<Response<ListHistoryResponse>, Status> {
        let caller = tenant_of(&request);
        let requested = request.into_inner().tenant;
        // Off the runtime: naming tenants looks users up (NSS may be a network round trip).
        let this = self.clone();
        let listed = crate::runtime::exec::blocking(move || {
            history::list(&this.core, &this.history_asker(&caller), &requested)
        })
        .await?;
        Ok(Response::new(listed))
    }

    async fn erase_history(
        &self,
        request: Request<EraseHistoryRequest>,
    ) -> Result<Response<EraseHistoryResponse>, Status> {
        let caller = tenant_of(&request);
        let requested = request.into_inner().tenant;
        tracing::info!(by = %caller, tenant = %requested, "job history erase asked");
        let this = self.clone();
        let erased = crate::runtime::exec::blocking(move || {
            history::erase(&this.core, &this.history_asker(&caller), &requested)
        })
        .await?;
        Ok(Response::new(erased))
    }

    async fn set_policy(
        &self,
        request: Request<SetPolicyRequest>,
    ) -> Result<Response<SetPolicyResponse>, Status> {
        self.admin_only(&request, "changing the scheduling policy")?;
        let name = request.into_inner().policy;
        let (previous, policy) = self.core.set_policy(&name)?;
        tracing::info!(previous, policy, "scheduling policy changed");
        self.node.settings.record_policy(policy);
        self.node
            .settings
            .persist_or_warn("the scheduling policy")
            .await;
        Ok(Response::new(SetPolicyResponse {
            previous: previous.into(),
            policy: policy.into(),
        }))
    }

    async fn set_job_hints(
        &self,
        request: Request<SetJobHintsRequest>,
    ) -> Result<Response<JobInfo>, Status> {
        let viewer = self.viewer(&tenant_of(&request));
        let req = request.into_inner();
        self.set_job_hints_as(req, viewer).await.map(Response::new)
    }

    async fn drain(&self, request: Request<DrainRequest>) -> Result<Response<DrainStatus>, Status> {
        let caller = self.admin_only(&request, "draining the node")?;
        let settings = &self.node.settings;
        let was = settings.drain();
        let until_restart = request.get_ref().until_restart;
        let drain =
            settings.record_drain(Some(DrainRecord::now(&caller.to_string(), until_restart)));
        self.core
            .set_drain(drain.as_ref().map(DrainRecord::refusal));
        if was.is_none() {
            tracing::warn!(by = %caller, "node drained: new jobs are refused until `salus undrain`; open jobs run on");
            settings.persist_or_warn("the drain").await;
        }
        self.drain_status().await.map(Response::new)
    }

    async fn undrain(
        &self,
        request: Request<UndrainRequest>,
    ) -> Result<Response<DrainStatus>, Status> {
        let caller = self.admin_only(&request, "undraining the node")?;
        let settings = &self.node.settings;
        let was = settings.drain();
        settings.record_drain(None);
        self.core.set_drain(None);
        if was.is_some() {
            tracing::info!(by = %caller, "node undrained: new jobs are admitted again");
            settings.persist_or_warn("the end of the drain").await;
        }
        self.drain_status().await.map(Response::new)
    }

    async fn reload(
        &self,
        request: Request<ReloadRequest>,
    ) -> Result<Response<ReloadResponse>, Status> {
        let caller = self.admin_only(&request, "reloading the config")?;
        tracing::info!(by = %caller, "reload asked (salus reload)");
        let report = self
            .node
            .settings
            .reload(self.identifier.clone())
            .await
            .map_err(|err| Status::from(Error::FailedPrecondition(err)))?;
        Ok(Response::new(reload_response(&report)))
    }

    async fn get_timeline(
        &self,
        request: Request<GetTimelineRequest>,
    ) -> Result<Response<Timeline>, Status> {
        let viewer = self.viewer(&tenant_of(&request));
        let window = super::timeline::window(request.into_inner().seconds)?;
        let mut snapshot = self.core.timeline().snapshot(window);
        if let Viewer::Tenant(key) = &viewer {
            snapshot
                .spans
                .retain(|span| span.label.as_ref().and_then(|l| l.owner.as_ref()) == Some(key));
        }
        Ok(Response::new(super::timeline::to_proto(
            &snapshot,
            self.node.started,
        )))
    }
}

fn cuda_device(probe: &crate::gpu_probe::GpuProbe) -> CudaDevice {
    let (total_bytes, free_bytes, error) = match &probe.memory {
        Ok(memory) => (memory.total, memory.free, String::new()),
        Err(why) => (0, 0, why.clone()),
    };
    CudaDevice {
        cuda_build: probe.cuda_build,
        total_bytes,
        free_bytes,
        error,
    }
}

#[cfg(test)]
mod hints_tests {
    use super::*;

    fn current() -> Hints {
        Hints {
            name: "train".into(),
            priority: 7,
            expected_iterations: Some(100),
            expected_seconds: Some(30.0),
            persistent_bytes: Some(1 << 20),
            ephemeral_bytes: None,
        }
    }

    /// `salus hints JOB --iterations N` once reset the priority to 0: only the
    /// fields a request sets change.
    #[test]
    fn a_hints_update_changes_only_the_fields_it_sets() {
        let only_iterations = JobHintsUpdate {
            expected_iterations: Some(500),
            ..Default::default()
        };
        let merged = merge_hints(current(), &only_iterations, "train".into());
        assert_eq!(merged.priority, 7);
        assert_eq!(merged.expected_iterations, Some(500));
        assert_eq!(merged.expected_seconds, Some(30.0));
        assert_eq!(merged.persistent_bytes, Some(1 << 20));

        let cleared = JobHintsUpdate {
            priority: Some(0),
            expected_seconds: Some(0.0),
            ..Default::default()
        };
        let merged = merge_hints(current(), &cleared, "train".into());
        assert_eq!(merged.priority, 0);
        assert_eq!(merged.expected_seconds, None);
        assert_eq!(merged.expected_iterations, Some(100));

        assert_eq!(
            merge_hints(current(), &JobHintsUpdate::default(), "train".into()),
            current()
        );
    }

    /// An older client's JobHints decodes as an update of the fields it put on
    /// the wire (proto3 leaves zeros off): same field numbers and types.
    #[test]
    fn an_older_clients_job_hints_decode_as_an_update() {
        use prost::Message;
        let old = JobHints {
            priority: 3,
            expected_iterations: 0,
            expected_seconds: 12.5,
        };
        let update = JobHintsUpdate::decode(old.encode_to_vec().as_slice()).unwrap();
        assert_eq!(update.priority, Some(3));
        assert_eq!(update.expected_iterations, None);
        assert_eq!(update.expected_seconds, Some(12.5));
    }
}
