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
use crate::runtime::executor::TenantFigures;
use crate::sched::tenants::MAX_WEIGHT;
use crate::tenant::identity::Identifier;
use crate::tenant::limits::Limits;
use crate::tenant::grants::{self, token_tenant};
use crate::tenant::tokens;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use crate::runtime::latency::LatencySnapshot;
use crate::runtime::report::Rows;
use crate::runtime::state::ServerState;
use crate::sched::{Hints, JobId};
use crate::seam::msg as seam_msg;
use crate::tenant::admins::Admins;
use crate::tenant::identity::{Tenant, TenantKey};

#[derive(Clone)]
pub struct AdminService {
    state: Arc<ServerState>,
    /// Who tenants are; its store of tokens issued at run time (None: this
    /// process issues none, e.g. a tenant's executor).
    identifier: Option<Arc<Identifier>>,
    /// Under `--isolation tenant`, the jobs live in the tenants' executor
    /// processes: rows and counters come from their reports, the scheduler's
    /// columns from this process.
    executors: Option<Arc<dyn ExecutorProcesses>>,
    admins: Arc<Admins>,
}

/// The tenants' executor processes as the admin API needs them (the
/// supervisor's `supervisor::executors::Executors` implements it): the admin
/// service depends on this, not on the supervisor.
pub trait ExecutorProcesses: Send + Sync {
    /// Each running executor's report with its tenant, within `timeout` each
    /// (an executor that does not answer is left out), holding only the rows
    /// of jobs that executor owns. Blocks: call it off the async runtime.
    fn reports(&self, timeout: Duration) -> Vec<(Arc<Tenant>, seam_msg::Report)>;
    /// Executors running now, started and failed since the server started.
    fn counts(&self) -> ExecutorProcessCounts;
    /// Stops `tenant`'s executor, if it runs: the tenant may no longer be
    /// served (`why`: its token was revoked or expired).
    fn stop_tenant(&self, tenant: &TenantKey, why: &str);
}

/// [`ExecutorProcesses::counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorProcessCounts {
    pub running: u64,
    pub started: u64,
    pub failed: u64,
}

/// Whose jobs a caller of the admin API sees.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Viewer {
    Admin,
    Tenant(TenantKey),
}

impl Viewer {
    fn sees(&self, owner: &TenantKey) -> bool {
        match self {
            Viewer::Admin => true,
            Viewer::Tenant(key) => key == owner,
        }
    }

    /// "no job has ..." / "no job of yours has ...".
    fn whose(&self) -> &'static str {
        match self {
            Viewer::Admin => "no job",
            Viewer::Tenant(_) => "no job of yours",
        }
    }
}

/// How long the admin API waits for an executor's report.
const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl AdminService {
    pub fn new(state: Arc<ServerState>) -> AdminService {
        AdminService {
            state,
            identifier: None,
            executors: None,
            admins: Arc::new(Admins::default()),
        }
    }

    /// The supervisor's admin API, over the tenants' executors.
    pub fn with_executors(state: Arc<ServerState>, executors: Arc<dyn ExecutorProcesses>) -> AdminService {
        AdminService {
            state,
            identifier: None,
            executors: Some(executors),
            admins: Arc::new(Admins::default()),
        }
    }

    /// Who may act on every tenant's jobs (`--admins`, besides the server's
    /// own user and root).
    pub fn with_admins(mut self, admins: Admins) -> AdminService {
        self.admins = Arc::new(admins);
        self
    }

    /// Issues tokens into `identifier`'s store, and forgets expired ones
    /// (with the limits they gave) every few seconds.
    pub fn with_identifier(mut self, identifier: Arc<Identifier>) -> AdminService {
        let executors = self.executors.clone();
        grants::sweep_expired(
            Arc::downgrade(&identifier),
            Arc::new(self.state.grant_holder()),
            move |identifier, token, now| {
                end_connections(executors.as_deref(), identifier, token, now, "its token expired")
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
                self.admins.describe()
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
            Error::FailedPrecondition("this process issues no tokens: ask the server's listening address".into())
                .into()
        })
    }

    fn viewer(&self, caller: &Tenant) -> Viewer {
        if self.admins.allows(caller) {
            Viewer::Admin
        } else {
            Viewer::Tenant(caller.key.clone())
        }
    }

    /// The executors' reports, each with its tenant (blocks: call it off the
    /// async runtime).
    fn reports(&self) -> Vec<(Arc<Tenant>, seam_msg::Report)> {
        match &self.executors {
            Some(executors) => executors.reports(REPORT_TIMEOUT),
            None => Vec::new(),
        }
    }

    /// This process's jobs and counters, as an executor reports them to the supervisor.
    pub fn executor_report(&self) -> seam_msg::Report {
        let info = self.server_info();
        let (sessions_reclaimed, eager_contexts_reclaimed) = self.state.reclaimed();
        seam_msg::Report {
            id: 0,
            jobs: self.jobs().into_iter().map(crate::seam::rows::row_to_msg).collect(),
            open_sessions: info.open_sessions,
            open_eager_contexts: info.open_eager_contexts,
            sessions_created: info.sessions_created,
            runs_completed: info.runs_completed,
            heap_in_use_bytes: info.heap_in_use_bytes,
            sessions_reclaimed,
            eager_contexts_reclaimed,
            run_errors: info
                .run_errors
                .into_iter()
                .map(|e| seam_msg::RunErrors {
                    code: e.code,
                    count: e.count,
                })
                .collect(),
        }
    }


    /// Version, devices and server-wide counters (`GetServerInfo`).
    pub fn server_info(&self) -> ServerInfo {
        self.server_info_from(&self.reports())
    }

    /// The server's counters and its jobs from one round of executor reports
    /// (`/metrics`: one report per executor per scrape). Blocks: call it off
    /// the async runtime.
    pub fn snapshot(&self) -> (ServerInfo, Vec<JobInfo>) {
        let reports = self.reports();
        let info = self.server_info_from(&reports);
        (info, self.jobs_from(reports, &Viewer::Admin))
    }

    fn server_info_from(&self, reports: &[(Arc<Tenant>, seam_msg::Report)]) -> ServerInfo {
        let mut info = self.own_server_info();
        if let Some(executors) = &self.executors {
            info.isolation = "tenant".into();
            let counts = executors.counts();
            info.executors_running = counts.running;
            info.executors_started = counts.started;
            info.executors_failed = counts.failed;
        } else {
            info.isolation = "none".into();
        }
        for (_, report) in reports {
            info.open_sessions += report.open_sessions;
            info.open_eager_contexts += report.open_eager_contexts;
            info.sessions_created += report.sessions_created;
            info.runs_completed += report.runs_completed;
            info.heap_in_use_bytes += report.heap_in_use_bytes;
            info.sessions_reclaimed += report.sessions_reclaimed;
            info.eager_contexts_reclaimed += report.eager_contexts_reclaimed;
            for count in &report.run_errors {
                match info.run_errors.iter_mut().find(|c| c.code == count.code) {
                    Some(c) => c.count += count.count,
                    None => info.run_errors.push(ErrorCount {
                        code: count.code.clone(),
                        count: count.count,
                    }),
                }
            }
        }
        info
    }

    fn own_server_info(&self) -> ServerInfo {
        let s = &self.state;
        let admission = s.admission.as_ref().map(|a| a.counts()).unwrap_or_default();
        let (sessions_reclaimed, eager_contexts_reclaimed) = s.reclaimed();
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
            open_sessions: s.sessions.len() as u64,
            open_eager_contexts: s.contexts.len() as u64,
            heap_in_use_bytes: crate::heap_meter::heap_in_use(),
            sessions_created: s.sessions.sessions_created(),
            runs_completed: s.runs_completed(),
            uptime_seconds: s.started.elapsed().as_secs_f64(),
            policy: s.executor.policy_name().into(),
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
            sessions_reclaimed,
            eager_contexts_reclaimed,
            run_errors: crate::runtime::run_errors::snapshot()
                .into_iter()
                .map(|(code, count)| ErrorCount {
                    code: code.as_str_name().into(),
                    count,
                })
                .collect(),
            // Filled in by `server_info`.
            ..Default::default()
        }
    }

    /// Every open job, by id (`ListJobs`; `/metrics` reads it too). Walks
    /// graphs under TF's lock: call it off the async runtime.
    pub fn jobs(&self) -> Vec<JobInfo> {
        self.jobs_from(self.reports(), &Viewer::Admin)
    }

    /// The open jobs `viewer` sees: from the executors' `reports` under
    /// tenant isolation, this process's tables otherwise.
    fn jobs_from(
        &self,
        reports: Vec<(Arc<Tenant>, seam_msg::Report)>,
        viewer: &Viewer,
    ) -> Vec<JobInfo> {
        let mut jobs: Vec<JobInfo> = if self.executors.is_some() {
            reported_rows(reports, viewer)
                .into_iter()
                .map(|row| Rows(&self.state).with_scheduler_view(row))
                .collect()
        } else {
            let mut rows = owned_rows(self.state.sessions.all_owned(), viewer, |j| Rows(&self.state).graph(j));
            rows.extend(owned_rows(self.state.contexts.all_owned(), viewer, |j| {
                Rows(&self.state).eager(j)
            }));
            rows
        };
        jobs.sort_by_key(|j| j.id);
        jobs
    }

    /// The owner of a job in this process's tables.
    fn owner_here(&self, id: JobId) -> Option<Arc<Tenant>> {
        self.state
            .sessions
            .all_owned()
            .into_iter()
            .find(|(_, j)| j.id == id)
            .map(|(owner, _)| owner)
            .or_else(|| {
                self.state
                    .contexts
                    .all_owned()
                    .into_iter()
                    .find(|(_, j)| j.id == id)
                    .map(|(owner, _)| owner)
            })
    }

    /// Scheduler statistics, every tenant's row included (`/metrics`).
    pub fn scheduler_stats(&self) -> SchedulerStats {
        self.scheduler_stats_for(&Viewer::Admin)
    }

    /// Scheduler statistics with the tenant rows `viewer` sees (`GetStats`).
    fn scheduler_stats_for(&self, viewer: &Viewer) -> SchedulerStats {
        let stats = self.state.executor.stats();
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
                    .state
                    .admission
                    .as_ref()
                    .map(Admission::claimed_by_tenant)
                    .unwrap_or_default();
                self.state
                    .executor
                    .tenant_figures()
                    .iter()
                    .filter(|figures| viewer.sees(&figures.tenant.key))
                    .map(|figures| {
                        tenant_share(figures, memory.get(&figures.status.id).copied().unwrap_or(0))
                    })
                    .collect()
            },
        }
    }

}


/// The executors' rows of the jobs `viewer` sees, each with its owner (the
/// executor's tenant, not anything the executor says).
fn reported_rows(reports: Vec<(Arc<Tenant>, seam_msg::Report)>, viewer: &Viewer) -> Vec<JobInfo> {
    reports
        .into_iter()
        .filter(|(tenant, _)| viewer.sees(&tenant.key))
        .flat_map(|(tenant, report)| {
            report
                .jobs
                .into_iter()
                .map(move |row| owned_by(&tenant, crate::seam::rows::row_from_msg(row)))
        })
        .collect()
}

/// The rows of the jobs `viewer` sees, each with its owner.
fn owned_rows<J>(
    owned: Vec<(Arc<Tenant>, Arc<J>)>,
    viewer: &Viewer,
    info: impl Fn(&J) -> JobInfo,
) -> Vec<JobInfo> {
    owned
        .into_iter()
        .filter(|(owner, _)| viewer.sees(&owner.key))
        .map(|(owner, job)| owned_by(&owner, info(&job)))
        .collect()
}

/// `row` with its owner: the display label and, apart, the bare name and uid
/// (clients that show tenants as data must not parse the label).
fn owned_by(owner: &Tenant, row: JobInfo) -> JobInfo {
    JobInfo {
        tenant: owner.to_string(),
        tenant_name: owner.name.clone(),
        tenant_uid: owner.uid,
        ..row
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
        let (Some(identifier), Some(admission)) = (&self.identifier, &self.state.admission) else {
            return Vec::new();
        };
        let claimed = admission.claimed_by_tenant();
        let now = SystemTime::now();
        let mut by_tenant: Vec<(Tenant, Vec<tokens::IssuedToken>)> = Vec::new();
        for token in identifier.issued().list() {
            if token.expired(now) || token.limits.memory.is_none() {
                continue;
            }
            match by_tenant.iter_mut().find(|(_, tokens)| tokens[0].same_tenant(&token)) {
                Some((_, tokens)) => tokens.push(token),
                None => by_tenant.push((token_tenant(&token), vec![token])),
            }
        }
        by_tenant
            .into_iter()
            .filter(|(tenant, _)| viewer.sees(&tenant.key))
            .map(|(tenant, tokens)| {
                let id = self.state.executor.tenant_id(&tenant);
                let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                Reservation {
                    tenant: tenant.to_string(),
                    tenant_name: tenant.name.clone(),
                    tenant_uid: tenant.uid,
                    reserved_bytes: admission.reserved_by_tenant([id]).get(&id).copied().unwrap_or(0),
                    claimed_bytes: claimed.get(&id).copied().unwrap_or(0),
                    token_ids: tokens.iter().map(|t| t.id.clone()).collect(),
                    expires_unix_seconds: tokens.iter().filter_map(|t| t.expires_at).min().map_or(0.0, unix),
                    jobs_started: self.state.executor.jobs_opened(id),
                }
            })
            .collect()
    }
}

/// Ends the open connections and jobs of `gone`'s tenant (under `--isolation
/// tenant`, by stopping its executor) unless it can still be identified
/// otherwise. Under `--isolation none` every request is identified anew, so
/// there is nothing to end: the tenant's next request is refused.
fn end_connections(
    executors: Option<&dyn ExecutorProcesses>,
    identifier: &Identifier,
    gone: &tokens::IssuedToken,
    now: SystemTime,
    why: &str,
) {
    if let Some(executors) = executors {
        if !identifier.still_admits(gone, now) {
            executors.stop_tenant(&token_tenant(gone).key, why);
        }
    }
}

fn token_info(token: &tokens::IssuedToken) -> TokenInfo {
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
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
            return Err(
                Error::InvalidArgument(format!("a weight is 1 to {MAX_WEIGHT}, not {weight}")).into(),
            );
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
    /// `SetJobHints` for a job in an executor process: found by id, handle or
    /// name in the executors' reports; the hints are the scheduler's, here.
    async fn set_executor_job_hints(
        &self,
        req: SetJobHintsRequest,
        viewer: Viewer,
    ) -> Result<JobInfo, Status> {
        let this = self.clone();
        let seen = viewer.clone();
        let rows = crate::runtime::exec::blocking(move || {
            Ok(reported_rows(this.reports(), &seen))
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
        let hints = hints_from_request(&req, row.name.clone(), &self.state, id)?;
        self.state.executor.set_hints(id, hints.clone())?;
        tracing::info!(job = id.0, ?hints, "job hints changed");
        Ok(Rows(&self.state).with_scheduler_view(row))
    }
}

/// The hints a SetJobHints request gives `id` (memory hints kept).
fn hints_from_request(
    req: &SetJobHintsRequest,
    name: String,
    state: &ServerState,
    id: JobId,
) -> Result<Hints, Status> {
    let given = req.hints.clone().unwrap_or_default();
    if given.expected_seconds < 0.0 || !given.expected_seconds.is_finite() {
        return Err(Error::InvalidArgument(
            "expected_seconds must be a finite number >= 0 (0: none)".into(),
        )
        .into());
    }
    Ok(Hints {
        name,
        priority: given.priority,
        expected_iterations: (given.expected_iterations > 0).then_some(given.expected_iterations),
        expected_seconds: (given.expected_seconds > 0.0).then_some(given.expected_seconds),
        ..state
            .executor
            .job_status(id)
            .map(|s| s.hints)
            .unwrap_or_default()
    })
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
            Ok((this.jobs_from(this.reports(), &viewer), this.reservations_for(&viewer)))
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
        let now = self.state.executor.set_limits(name, &limits);
        tracing::info!(tenant = name, limits = %now, by = %caller, "tenant limits changed");
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
                return Err(Error::InvalidArgument(format!("no Unix user has uid {uid} on this machine")).into());
            }
        }
        let lifetime = (req.expires_seconds > 0.0).then(|| Duration::from_secs_f64(req.expires_seconds));
        // Off the runtime: issuing saves the state file (a fsync).
        let issuing = identifier.clone();
        let tenant = req.tenant.clone();
        let (token, record) = tokio::task::spawn_blocking(move || issuing.issued().issue(&tenant, uid, limits, lifetime))
            .await
            .map_err(|e| Error::Internal(format!("issuing a token failed: {e}")))?
            .map_err(|e| Error::Internal(e.to_string()))?;
        let now = SystemTime::now();
        let holder = self.state.grant_holder();
        if let Err(err) = grants::apply(&holder, identifier.issued(), &record, now) {
            // The reservation does not fit: the token was never handed out.
            let revoking = identifier.clone();
            let id = record.id.clone();
            let _ = tokio::task::spawn_blocking(move || revoking.issued().revoke(&id)).await;
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
        let which = request.into_inner().which;
        // Off the runtime: revoking saves the state file (a fsync).
        let revoking = identifier.clone();
        let asked = which.clone();
        let revoked = tokio::task::spawn_blocking(move || revoking.issued().revoke(&asked))
            .await
            .map_err(|e| Error::Internal(format!("revoking failed: {e}")))?;
        if revoked.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "no issued token has id {which:?} or is of tenant {which:?} (tokens of the tenants file are revoked by editing it)"
            ))
            .into());
        }
        let now = SystemTime::now();
        let holder = self.state.grant_holder();
        for token in &revoked {
            tracing::info!(id = token.id, tenant = token.tenant, by = %caller, "token revoked");
            grants::apply(&holder, identifier.issued(), token, now)?;
            end_connections(self.executors.as_deref(), identifier, token, now, "its token was revoked");
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
        let asker = self.history_asker(&caller);
        let listed = history::list(&self.state.executor, &asker, &request.get_ref().tenant)?;
        Ok(Response::new(listed))
    }

    async fn erase_history(
        &self,
        request: Request<EraseHistoryRequest>,
    ) -> Result<Response<EraseHistoryResponse>, Status> {
        let caller = tenant_of(&request);
        let asker = self.history_asker(&caller);
        let tenant = &request.get_ref().tenant;
        let erased = history::erase(&self.state.executor, &asker, tenant)?;
        tracing::info!(by = %caller, "job history erase asked");
        Ok(Response::new(erased))
    }

    async fn set_policy(
        &self,
        request: Request<SetPolicyRequest>,
    ) -> Result<Response<SetPolicyResponse>, Status> {
        self.admin_only(&request, "changing the scheduling policy")?;
        let name = request.into_inner().policy;
        let (previous, policy) = self.state.executor.set_policy(&name)?;
        tracing::info!(previous, policy, "scheduling policy changed");
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
        if self.executors.is_some() {
            return self
                .set_executor_job_hints(req, viewer)
                .await
                .map(Response::new);
        }
        let not_found = || {
            Status::from(Error::InvalidArgument(format!(
                "{} has id, handle or name {:?}",
                viewer.whose(),
                req.job
            )))
        };
        let (id, name, eager) = match self.state.sessions.find(&req.job) {
            Ok(job) => (job.id, job.name.clone(), None),
            Err(_) => match self.state.contexts.find(&req.job) {
                Some(job) => (job.id, job.name.clone(), Some(job)),
                None => return Err(not_found()),
            },
        };
        let Some(owner) = self.owner_here(id).filter(|o| viewer.sees(&o.key)) else {
            return Err(not_found());
        };
        let hints = hints_from_request(&req, name, &self.state, id)?;
        self.state.executor.set_hints(id, hints.clone())?;
        tracing::info!(job = id.0, ?hints, "job hints changed");
        let this = self.clone();
        let info = match eager {
            Some(job) => Rows(&this.state).eager(&job),
            None => {
                let job = self.state.sessions.find(&req.job)?;
                crate::runtime::exec::blocking(move || Ok(Rows(&this.state).graph(&job))).await?
            }
        };
        Ok(Response::new(owned_by(&owner, info)))
    }

    async fn get_timeline(
        &self,
        request: Request<GetTimelineRequest>,
    ) -> Result<Response<Timeline>, Status> {
        let viewer = self.viewer(&tenant_of(&request));
        let window = super::timeline::window(request.into_inner().seconds)?;
        let mut snapshot = self.state.executor.timeline().snapshot(window);
        if let Viewer::Tenant(key) = &viewer {
            snapshot
                .spans
                .retain(|span| span.label.as_ref().and_then(|l| l.owner.as_ref()) == Some(key));
        }
        Ok(Response::new(super::timeline::to_proto(
            &snapshot,
            self.state.started,
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
