//! The tenants' executor processes: started at a tenant's first request, as
//! that tenant's Unix user where the server can switch users; watched, reaped
//! and replaced after a crash; stopped when idle, or with the server.
//!
//! An executor is this same binary (`salus-server ... executor`), given three
//! sockets of socketpairs as fds 3 (HTTP/2: the relayed gRPC calls), 4 (the
//! seam) and 5 (client connections handed over), and its tenant and credentials in `SALUS_EXECUTOR_*` variables. It
//! drops privileges first thing in `main`, before any thread starts (see
//! `crate::executor`): the binary and TensorFlow's libraries are loaded by
//! then, so a tenant needs no access to the install.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::runtime::admission::Admission;
use crate::runtime::executor::Executor;
use crate::runtime::job_source::{
    owned_by, ExecutorProcessCounts, Gathered, JobCounters, JobSource, Viewer,
};
use crate::runtime::node::Node;
use crate::seam::handover::Handed;
use crate::seam::msg;
use crate::supervisor::handed::HandedConnections;
use crate::supervisor::link::{Link, LinkSpec};
use crate::supervisor::pidfd::ExecutorProcess;
use crate::sync::lock;
use crate::tenant::connections::ConnectionPermit;
use crate::tenant::identity::{Tenant, TenantKey};
use crate::tenant::uid_pool::UidPool;

pub use super::death::DeathNote;

/// How executors are started.
#[derive(Clone, Debug)]
pub struct ExecutorSpec {
    pub exe: PathBuf,
    /// The per-job checkpoint base (`./salus-checkpoints`) when the server
    /// uses one; a tenant that is no user gets its own directory below it,
    /// owned by the user its executor runs as.
    pub checkpoint_base: Option<PathBuf>,
    /// `--checkpoint-root`, absolute.
    pub checkpoint_root: Option<PathBuf>,
    /// The server's own arguments; `executor` is appended.
    pub args: Vec<OsString>,
    /// `--executor-memory`.
    pub memory_limit: Option<u64>,
    /// An executor with no open job and no request this long is stopped.
    pub idle_timeout: Duration,
    /// Longest wait for a new executor to start serving.
    pub start_timeout: Duration,
    /// `--lane-hold-limit`: how long the scheduler waits for a main
    /// iteration's end before it starts others beside it.
    pub lane_hold_limit: Option<Duration>,
    /// `--silence-limit`: how long an executor holding a lane may leave a
    /// ping unanswered before its lanes go to others.
    pub silence_limit: Option<Duration>,
    /// `-v`: pass the executors' TensorFlow INFO/WARNING lines on too.
    pub verbose: bool,
    /// `--executor-log-rate`: bytes per second of each executor's output
    /// copied into the server's log; `None`: all of it.
    pub log_rate: Option<u64>,
    /// The rendezvous folder in the state directory (`seam::adoption`), where
    /// executors can be found by the next supervisor; None: they end with
    /// this one (`--adopt-grace 0`).
    pub rendezvous: Option<PathBuf>,
    /// The uids of tenants that are no Unix user (`--tenant-uid-range`).
    pub uid_pool: Arc<UidPool>,
}

/// One running executor.
pub struct ExecutorHandle {
    pub tenant: Arc<Tenant>,
    pub pid: u32,
    pub sender: SendRequest<RelayRequestBody>,
    /// Where client connections are handed to the executor.
    pub(super) handover: Arc<OwnedFd>,
    /// Copies of the connections handed over, to end them if it dies.
    pub(super) handed: Arc<HandedConnections>,
    pub link: Arc<Link>,
    pub death: Arc<DeathNote>,
    pub(super) in_flight: AtomicUsize,
    pub(super) last_active: Mutex<Instant>,
    /// The release of the binary it runs (an adopted executor may run the previous one).
    pub release: String,
    /// Started by an earlier supervisor.
    pub adopted: bool,
}

impl ExecutorHandle {
    pub fn is_dead(&self) -> bool {
        self.death.get().is_some() || self.link.is_dead()
    }

    /// Signals the executor through its pidfd: an executor already reaped
    /// is not signalled (nor whoever has its pid now).
    pub fn signal(&self, signal: i32) {
        self.link.process().signal_or_log(signal);
    }

    pub fn begin_request(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    pub fn end_request(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        *self.last_active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 || self.link.open_jobs() > 0 {
            return None;
        }
        Some(
            self.last_active
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed(),
        )
    }

    /// Gives the executor a client connection to serve, with the bytes the
    /// supervisor read from it; when that fails, the connection comes back if
    /// it can. The connection's permit stays with the supervisor's copy.
    pub async fn hand_over(
        &self,
        handed: Handed,
        permit: Option<ConnectionPermit>,
    ) -> Result<(), HandoverFailed> {
        let copy = match handed.conn.try_clone() {
            Ok(copy) => copy,
            Err(err) => {
                return Err(HandoverFailed {
                    why: format!("cannot keep a copy of the connection: {err}"),
                    returned: Some((handed, permit)),
                })
            }
        };
        let channel = self.handover.clone();
        let sent = tokio::task::spawn_blocking(move || {
            let result = crate::seam::handover::send(
                &channel,
                &handed.conn,
                &handed.read_ahead,
                handed.settings_acked,
            );
            (handed, result)
        })
        .await;
        match sent {
            Ok((_, Ok(()))) => {
                self.handed.keep(copy, permit);
                // Died meanwhile: the reaper (which records the death before it
                // ends the copies) may have ended the others already.
                if let Some(why) = self.death.get() {
                    self.handed.end_all(Some(why));
                }
                Ok(())
            }
            Ok((handed, Err(err))) => Err(HandoverFailed {
                returned: Some((handed, permit)),
                why: err.to_string(),
            }),
            Err(err) => Err(HandoverFailed {
                returned: None,
                why: err.to_string(),
            }),
        }
    }

    /// Why requests to this executor fail, once it is gone.
    pub async fn failure(&self) -> String {
        self.death
            .wait(Duration::from_secs(2))
            .await
            .unwrap_or_else(|| {
                format!(
                    "the executor process of tenant {} (pid {}) stopped answering",
                    self.tenant, self.pid
                )
            })
    }
}

/// A connection the executor could not take: it comes back to be relayed,
/// unless it was lost on the way.
pub struct HandoverFailed {
    pub returned: Option<(Handed, Option<ConnectionPermit>)>,
    pub why: String,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) cell: tokio::sync::OnceCell<Arc<ExecutorHandle>>,
}

/// Counters for the admin API and /metrics.
#[derive(Default)]
pub struct ExecutorCounts {
    pub started: AtomicU64,
    pub failed: AtomicU64,
}

pub struct Executors {
    pub(super) spec: ExecutorSpec,
    pub(super) executor: Executor,
    pub(super) admission: Option<Admission>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) slots: Mutex<HashMap<TenantKey, Arc<Slot>>>,
    /// How each tenant's last executor died, when it failed, until a successor starts.
    pub(super) deaths: Mutex<HashMap<TenantKey, String>>,
    pub(super) serial: AtomicU64,
    /// Set at shutdown: no new executors.
    pub(super) closing: std::sync::atomic::AtomicBool,
    /// Executors killed on purpose ([`Self::stop_tenant`]) and why, until reaped.
    killed: Mutex<HashMap<u32, String>>,
    pub counts: ExecutorCounts,
}

/// Longest wait to pass a connection to an executor (it reads them on a
/// thread of its own; one that does not is stuck, and the call is relayed).
pub(super) const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn set_send_timeout(socket: &OwnedFd, limit: Duration) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: limit.as_secs() as libc::time_t,
        tv_usec: limit.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a valid timeval on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether an executor's `Hello` shows it speaks this supervisor's seam: the
/// same protocol and the same release (both ends are meant to be one binary;
/// an executor from another build is refused with both sides named).
pub(super) fn compatible(hello: &msg::Hello) -> Result<(), String> {
    let ours = env!("CARGO_PKG_VERSION");
    if hello.protocol != crate::seam::PROTOCOL || hello.version != ours {
        return Err(format!(
            "its binary is salus-server {} speaking seam protocol {}, this supervisor {ours} speaking {}: \
             the executor binary is not this server's",
            hello.version,
            hello.protocol,
            crate::seam::PROTOCOL
        ));
    }
    Ok(())
}

/// A request body on its way to an executor.
pub type RelayRequestBody = http_body_util::combinators::UnsyncBoxBody<
    bytes::Bytes,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// What a call gets once the server is stopping and its tenant's executor is gone.
pub const SHUTTING_DOWN: &str = "the server is shutting down";

/// Why a tenant's executor could not be had ([`Executors::get`]).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The supervisor is stopping: it starts no executor.
    #[error("{SHUTTING_DOWN}")]
    ShuttingDown,
    /// Its executor died as it started, twice over.
    #[error("the executor process of tenant {0} died as it started; see the server's log")]
    DiedStarting(String),
    /// It could not be started, or did not start: why, for its clients and the log.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for StartError {
    fn from(why: String) -> StartError {
        StartError::Failed(why)
    }
}

impl Executors {
    pub fn new(
        spec: ExecutorSpec,
        executor: Executor,
        admission: Option<Admission>,
        runtime: tokio::runtime::Handle,
    ) -> Arc<Executors> {
        Arc::new(Executors {
            spec,
            executor,
            admission,
            runtime,
            slots: Mutex::new(HashMap::new()),
            deaths: Mutex::new(HashMap::new()),
            serial: AtomicU64::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
            killed: Mutex::new(Default::default()),
            counts: ExecutorCounts::default(),
        })
    }

    /// The running executors.
    pub fn running(&self) -> Vec<Arc<ExecutorHandle>> {
        lock(&self.slots)
            .values()
            .filter_map(|s| s.cell.get().cloned())
            .filter(|h| !h.is_dead())
            .collect()
    }

    /// `tenant`'s executor, started if it has none (or its last one died).
    pub async fn get(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
    ) -> Result<Arc<ExecutorHandle>, StartError> {
        for _ in 0..2 {
            let slot = lock(&self.slots)
                .entry(tenant.key.clone())
                .or_default()
                .clone();
            let handle = slot
                .cell
                .get_or_try_init(|| self.start(tenant.clone()))
                .await?
                .clone();
            if !handle.is_dead() {
                return Ok(handle);
            }
            self.forget_slot(&tenant.key, &slot);
        }
        Err(StartError::DiedStarting(tenant.to_string()))
    }

    /// Whether executor `pid` still serves its tenant here.
    pub(super) fn holds(&self, pid: u32) -> bool {
        lock(&self.slots)
            .values()
            .any(|s| s.cell.get().is_some_and(|h| h.pid == pid))
    }

    /// What a link to `tenant`'s executor `serial` knows and bounds.
    pub(super) fn link_spec(
        &self,
        label: String,
        tenant: &Tenant,
        serial: u64,
        process: Arc<ExecutorProcess>,
    ) -> LinkSpec {
        LinkSpec {
            label,
            owner: tenant.clone(),
            hold_limit: self.spec.lane_hold_limit,
            job_ids: job_ids(serial),
            silence_limit: self.spec.silence_limit,
            process,
        }
    }

    fn forget_slot(&self, key: &TenantKey, slot: &Arc<Slot>) {
        let mut slots = lock(&self.slots);
        if slots.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(key);
        }
    }

    fn forget_handle(&self, handle: &Arc<ExecutorHandle>) {
        let mut slots = lock(&self.slots);
        if slots
            .get(&handle.tenant.key)
            .and_then(|s| s.cell.get())
            .is_some_and(|h| Arc::ptr_eq(h, handle))
        {
            slots.remove(&handle.tenant.key);
        }
    }

    /// Books an ended executor; returns what its clients are told, if it did
    /// not stop cleanly.
    pub(super) fn reaped(
        &self,
        tenant: &Arc<Tenant>,
        pid: u32,
        clean: bool,
        message: &str,
    ) -> Option<String> {
        let stopped_because = lock(&self.killed).remove(&pid);
        let mut slots = lock(&self.slots);
        let ours = slots
            .get(&tenant.key)
            .and_then(|s| s.cell.get())
            .is_some_and(|h| h.pid == pid);
        if ours {
            slots.remove(&tenant.key);
        }
        drop(slots);
        if let Some(why) = stopped_because {
            // Killed on purpose (its tenant's token revoked): no failure.
            tracing::info!(tenant = %tenant, pid, "executor stopped");
            return Some(format!(
                "the server stopped the executor process of tenant {tenant}: {why}"
            ));
        }
        if clean {
            tracing::info!(tenant = %tenant, pid, "executor stopped");
            return None;
        }
        self.counts.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(tenant = %tenant, pid, "executor failed: {message}");
        // Its clients' connections end with it; their next calls reach
        // the successor, which tells them why their sessions are gone.
        lock(&self.deaths).insert(tenant.key.clone(), message.to_string());
        Some(message.to_string())
    }

    /// Stops `tenant`'s executor, if it runs, because the tenant may no longer
    /// be served (its token revoked or expired): its open connections close
    /// and its jobs end, whatever they were doing; their memory returns.
    pub fn stop_tenant(&self, tenant: &TenantKey, why: &str) {
        let handle = lock(&self.slots)
            .get(tenant)
            .and_then(|s| s.cell.get().cloned());
        let Some(handle) = handle.filter(|h| !h.is_dead()) else {
            return;
        };
        tracing::info!(tenant = %handle.tenant, pid = handle.pid, "stopping the executor: {why}");
        self.forget_handle(&handle);
        lock(&self.killed).insert(handle.pid, why.to_string());
        // SIGKILL: a drain would let its open connections go on being served.
        handle.signal(libc::SIGKILL);
    }

    /// Stops executors idle longer than the spec allows, and drops copies of
    /// ended connections (checked every few seconds).
    pub async fn stop_idle(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            for handle in self.running() {
                // Copies of connections the client closed since.
                handle.handed.prune();
                if handle
                    .idle_for()
                    .is_some_and(|idle| idle >= self.spec.idle_timeout)
                {
                    tracing::info!(tenant = %handle.tenant, pid = handle.pid, "stopping an idle executor");
                    self.forget_handle(&handle);
                    handle.signal(libc::SIGTERM);
                    // Stopped by its tenant, it would linger: it must run to exit.
                    handle.signal(libc::SIGCONT);
                }
            }
        }
    }

    /// Asks every executor to stop (they finish what they serve) and waits up
    /// to `limit` for them; then kills what is left.
    /// Shutdown, first half: no new executors; every executor is asked to
    /// stop (it refuses new work and drains its eager jobs while the relay
    /// still serves their follow-up calls); waits up to `limit` until all
    /// have drained.
    pub async fn drain_all(&self, limit: Duration) {
        self.closing.store(true, Ordering::SeqCst);
        let handles = self.running();
        for h in &handles {
            h.signal(libc::SIGTERM);
            // One its tenant stopped must run to drain.
            h.signal(libc::SIGCONT);
        }
        let all = async {
            for h in &handles {
                h.link.wait_drained().await;
            }
        };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!("executors still draining after the grace period");
        }
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub async fn stop_all(&self, limit: Duration) {
        self.closing.store(true, Ordering::SeqCst);
        let handles: Vec<Arc<ExecutorHandle>> = lock(&self.slots)
            .drain()
            .filter_map(|(_, s)| s.cell.get().cloned())
            .collect();
        for h in &handles {
            h.signal(libc::SIGTERM);
            // One its tenant stopped must run to drain.
            h.signal(libc::SIGCONT);
        }
        let deadline = Instant::now() + limit;
        for h in &handles {
            let left = deadline.saturating_duration_since(Instant::now());
            if h.death.wait(left).await.is_none() {
                tracing::warn!(tenant = %h.tenant, pid = h.pid, "executor did not stop in time: killing it");
                // Stopped on purpose: reaped as such, not as a failure.
                lock(&self.killed).insert(
                    h.pid,
                    format!(
                        "the server is stopping, and work of the executor (a run that does not end, such as a \
                         dequeue from a queue nobody fills) was still running after {} s",
                        limit.as_secs()
                    ),
                );
                h.signal(libc::SIGKILL);
                h.death.wait(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Waits for `child` to end and reaps it, telling `link` each time its
/// tenant stops or continues it (a child's stops reach its parent: waitid
/// with WSTOPPED and WCONTINUED), so a stopped executor holds no lane.
pub(super) fn wait_watching_stops(
    child: &mut std::process::Child,
    link: &Arc<Link>,
) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::id_t;
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-parameter.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WEXITED | libc::WSTOPPED | libc::WCONTINUED,
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // SAFETY: waitid filled a SIGCHLD siginfo, whose si_status is set.
        let status = unsafe { info.si_status() };
        // As a wait status word, which ExitStatus reads.
        return Ok(std::process::ExitStatus::from_raw(match info.si_code {
            libc::CLD_STOPPED | libc::CLD_TRAPPED => {
                link.stopped();
                continue;
            }
            libc::CLD_CONTINUED => {
                link.continued();
                continue;
            }
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        }));
    }
}

/// The HTTP/2 client of an executor's relay socket (its connection driven on
/// a task of its own).
pub(super) async fn relay_sender(
    h2_ours: UnixStream,
    tenant: &Tenant,
) -> Result<SendRequest<RelayRequestBody>, String> {
    h2_ours
        .set_nonblocking(true)
        .map_err(|e| format!("socket setup failed: {e}"))?;
    let io = tokio::net::UnixStream::from_std(h2_ours)
        .map_err(|e| format!("socket setup failed: {e}"))?;
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(crate::http2::H2_STREAM_WINDOW)
        .initial_connection_window_size(crate::http2::H2_CONNECTION_WINDOW)
        .max_frame_size(1 << 20)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("cannot talk to the executor of tenant {tenant}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}


/// The job ids of the executor with this serial number (it numbers its jobs
/// from the start of the range, `SALUS_EXECUTOR_JOB_BASE`).
pub(super) fn job_ids(serial: u64) -> std::ops::Range<u64> {
    serial << 32..(serial + 1) << 32
}

/// How long the admin API waits for an executor's report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The jobs are the executors': one report from each running executor (one
/// that does not answer within `REPORT_TIMEOUT` is left out), holding only
/// the rows of jobs that executor owns, each owned by the executor's tenant
/// (not anything the executor says).
impl JobSource for Executors {
    fn gather(&self, _: &Node, rows_for: Option<&Viewer>) -> Gathered {
        let mut gathered = Gathered {
            counters: JobCounters {
                isolation: "tenant",
                executors: ExecutorProcessCounts {
                    running: self.running().len() as u64,
                    started: self.counts.started.load(Ordering::Relaxed),
                    failed: self.counts.failed.load(Ordering::Relaxed),
                },
                executor_list: self
                    .running()
                    .iter()
                    .map(|h| salus_proto::salus::v1::ExecutorProcess {
                        tenant: h.tenant.to_string(),
                        pid: h.pid,
                        release: h.release.clone(),
                        adopted: h.adopted,
                        standing: h.link.standing().name().into(),
                        refused_messages: h.link.refused_messages(),
                    })
                    .collect(),
                ..Default::default()
            },
            rows: Vec::new(),
        };
        for handle in self.running() {
            let Some(report) = handle.link.report(REPORT_TIMEOUT) else {
                continue;
            };
            gathered.counters.add_report(&report);
            if rows_for.is_some_and(|viewer| viewer.sees(&handle.tenant.key)) {
                // Rows of jobs not its own would show another tenant's scheduler view.
                gathered.rows.extend(
                    report
                        .jobs
                        .into_iter()
                        .filter(|row| handle.link.owns_job(row.id))
                        .map(|row| owned_by(&handle.tenant, crate::seam::rows::row_from_msg(row))),
                );
            }
        }
        gathered
    }

    fn stop_tenant(&self, tenant: &TenantKey, why: &str) {
        Executors::stop_tenant(self, tenant, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_executor_of_another_build_is_refused() {
        let hello = |version: &str, protocol| msg::Hello {
            version: version.into(),
            pid: 1,
            uid: 0,
            protocol,
            adoption: None,
            answers_pings: true,
        };
        assert!(compatible(&hello(env!("CARGO_PKG_VERSION"), crate::seam::PROTOCOL)).is_ok());
        let why = compatible(&hello(env!("CARGO_PKG_VERSION"), 1)).unwrap_err();
        assert!(why.contains("seam protocol 1"), "{why}");
        let why = compatible(&hello("0.0.1", crate::seam::PROTOCOL)).unwrap_err();
        assert!(why.contains("salus-server 0.0.1"), "{why}");
    }
}
