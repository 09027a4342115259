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

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
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
use crate::supervisor::executor_log::forward_stderr;
use crate::supervisor::handed::HandedConnections;
use crate::supervisor::link::{Link, LinkSpec};
use crate::supervisor::pidfd::ExecutorProcess;
use crate::sync::lock;
use crate::tenant::connections::ConnectionPermit;
use crate::tenant::identity::{Tenant, TenantKey};
use crate::tenant::uid_pool::UidPool;
use crate::tenant::users::Account;

use super::checkpoint_dir::checkpoint_subdir;
use super::checkpoint_dir::prepare_checkpoint_dir;
use super::death::death_message;
pub use super::death::DeathNote;
use crate::seam::adoption::ExecutorRecord;
use crate::seam::contract::{env, ADOPT_FD, H2_FD, HANDOVER_FD, SEAM_FD};
use crate::seam::contract::{PASSED_ENV, PASSED_ENV_PREFIXES};

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
    deaths: Mutex<HashMap<TenantKey, String>>,
    pub(super) serial: AtomicU64,
    /// Set at shutdown: no new executors.
    closing: std::sync::atomic::AtomicBool,
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
fn compatible(hello: &msg::Hello) -> Result<(), String> {
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
    ) -> Result<Arc<ExecutorHandle>, String> {
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
        Err(format!(
            "the executor process of tenant {tenant} died as it started; see the server's log"
        ))
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

    /// Who `tenant`'s executor runs as: that user when the server runs as
    /// root; for a token tenant that is no user, a uid of its own from
    /// `--tenant-uid-range` (its gid the same number, no supplementary groups,
    /// its checkpoint directory or `/` as home); `nobody` for the anonymous
    /// tenant (`--auth off`: the only tenant); the server's own user when it
    /// cannot switch. None: no switch.
    pub(super) fn credentials(
        &self,
        tenant: &Tenant,
    ) -> Result<Option<(Account, Vec<u32>)>, String> {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 || tenant.uid == Some(euid) {
            return Ok(None);
        }
        let account = match (tenant.uid, &tenant.key) {
            (Some(uid), _) => Account::by_uid(uid).ok_or_else(|| {
                format!("tenant {tenant}: uid {uid} has no entry in the user database, so its executor cannot run as it")
            })?,
            (None, TenantKey::Named(_)) => {
                let uid = self
                    .spec
                    .uid_pool
                    .uid_of(&tenant.key)
                    .map_err(|why| format!("tenant {tenant}'s executor cannot start: {why}"))?;
                let home = match &self.spec.checkpoint_base {
                    Some(base) => base.join(checkpoint_subdir(tenant)),
                    None => PathBuf::from("/"),
                };
                let account = Account {
                    name: format!("{} (--tenant-uid-range)", tenant.name),
                    uid,
                    gid: uid,
                    home,
                };
                return Ok(Some((account, Vec::new())));
            }
            (None, _) => Account::by_name("nobody").unwrap_or(Account {
                name: "nobody".into(),
                uid: 65534,
                gid: 65534,
                home: PathBuf::from("/"),
            }),
        };
        let groups = account.groups();
        Ok(Some((account, groups)))
    }

    async fn start(self: &Arc<Self>, tenant: Arc<Tenant>) -> Result<Arc<ExecutorHandle>, String> {
        let began = Instant::now();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed) + 1;
        if self.closing.load(Ordering::SeqCst) {
            return Err(SHUTTING_DOWN.into());
        }
        let credentials = self.credentials(&tenant)?;
        let checkpoint_base = self
            .spec
            .checkpoint_base
            .as_ref()
            .map(|base| base.join(checkpoint_subdir(&tenant)));
        if let (Some(base), Some((account, groups))) = (&checkpoint_base, &credentials) {
            if tenant.uid.is_none() {
                prepare_checkpoint_dir(base, account, groups)?;
            }
        }
        let (h2_ours, h2_theirs) =
            UnixStream::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        let (seam_ours, seam_theirs) =
            UnixStream::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        let (handover_ours, handover_theirs) =
            crate::seam::handover::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        set_send_timeout(&handover_ours, HANDOVER_TIMEOUT)
            .map_err(|e| format!("socket setup failed: {e}"))?;
        let rendezvous = match &self.spec.rendezvous {
            Some(dir) => match rendezvous_socket(dir, serial) {
                Ok(made) => Some(made),
                Err(why) => {
                    // It still serves its tenant; only a restart would end its jobs.
                    tracing::warn!(tenant = %tenant, "{why}: this executor cannot be adopted after a restart");
                    None
                }
            },
            None => None,
        };
        let mut command = Command::new(&self.spec.exe);
        // The tenant can read its executor's environment: it gets only what
        // configures the server and TensorFlow, not the operator's other variables.
        command
            .env_clear()
            .envs(std::env::vars_os().filter(|(name, _)| {
                name.to_str().is_some_and(|name| {
                    name != "SALUS_TOKEN"
                        && (PASSED_ENV.contains(&name)
                            || PASSED_ENV_PREFIXES.iter().any(|p| name.starts_with(p)))
                })
            }));
        command
            .args(&self.spec.args)
            .arg("executor")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env(env::TENANT_NAME, &tenant.name)
            .env(env::TENANT_KEY, tenant.key.to_text())
            .env(env::JOB_BASE, job_ids(serial).start.to_string());
        if let Some(base) = &checkpoint_base {
            command.env(env::CHECKPOINT_BASE, base);
        }
        if let Some(root) = &self.spec.checkpoint_root {
            command.env(env::CHECKPOINT_ROOT, root);
        }
        if let Some(limit) = self.spec.memory_limit {
            command.env(env::MEMORY, limit.to_string());
        }
        if let Some(note) = lock(&self.deaths).remove(&tenant.key) {
            command.env(env::PREDECESSOR, note);
        }
        if let Some((_, secret)) = &rendezvous {
            command
                .env(env::ADOPT_SECRET, secret)
                .env(env::SERIAL, serial.to_string());
        }
        let uid = match &credentials {
            Some((account, groups)) => {
                let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
                command.env(
                    env::RUN_AS,
                    format!(
                        "{}:{}:{}:{}",
                        account.uid,
                        account.gid,
                        groups.join(","),
                        account.home.display()
                    ),
                );
                account.uid
            }
            // SAFETY: geteuid cannot fail.
            None => unsafe { libc::geteuid() },
        };
        let h2_fd = h2_theirs.as_raw_fd();
        let seam_fd = seam_theirs.as_raw_fd();
        let handover_fd = handover_theirs.as_raw_fd();
        let adopt_fd = rendezvous.as_ref().map(|(l, _)| l.as_raw_fd());
        // SAFETY: only async-signal-safe calls (setsid, fcntl, dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // A session of its own: a terminal's Ctrl-C or hangup reaches the
                // supervisor, which decides what its executors do.
                libc::setsid();
                if let Some(fd) = adopt_fd {
                    let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                    if moved < 0 || libc::dup2(moved, ADOPT_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Out of the way first, so neither target fd clobbers the other.
                let h2 = libc::fcntl(h2_fd, libc::F_DUPFD_CLOEXEC, 10);
                let seam = libc::fcntl(seam_fd, libc::F_DUPFD_CLOEXEC, 10);
                let handover = libc::fcntl(handover_fd, libc::F_DUPFD_CLOEXEC, 10);
                if h2 < 0 || seam < 0 || handover < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // dup2 clears close-on-exec on the new fd.
                if libc::dup2(h2, H2_FD) < 0
                    || libc::dup2(seam, SEAM_FD) < 0
                    || libc::dup2(handover, HANDOVER_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start an executor for tenant {tenant}: {e}"))?;
        drop(h2_theirs);
        drop(seam_theirs);
        drop(handover_theirs);
        let pid = child.id();
        // Named before anything could reap it: kills go through the pidfd.
        let process = Arc::new(ExecutorProcess::open(pid));
        let adoptable = rendezvous.is_some();
        if let (Some(dir), Some((listener, secret))) = (&self.spec.rendezvous, rendezvous) {
            drop(listener);
            let record = ExecutorRecord {
                serial,
                pid,
                uid,
                tenant_key: tenant.key.to_text(),
                tenant_name: tenant.name.clone(),
                secret,
                release: env!("CARGO_PKG_VERSION").into(),
            };
            if let Err(err) = record.save(dir) {
                tracing::warn!(tenant = %tenant, pid, cause = %err, "cannot write the executor's record: a restarted server will not adopt it");
            }
        }
        let label = format!("{}:{pid}", tenant.name);
        let last_lines = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_ended = child.stderr.take().map(|stderr| {
            forward_stderr(
                stderr,
                label.clone(),
                last_lines.clone(),
                self.spec.verbose,
                self.spec.log_rate,
            )
        });
        let (link, hello) = Link::start(
            seam_ours,
            self.executor.clone(),
            self.admission.clone(),
            self.runtime.clone(),
            self.link_spec(label.clone(), &tenant, serial, process.clone()),
        )
        .map_err(|e| format!("cannot watch the executor of tenant {tenant}: {e}"))?;
        let death = Arc::new(DeathNote::default());
        let handed = Arc::new(HandedConnections::default());
        // Reaps the process whenever it ends.
        let (exited_tx, mut exited_rx) = tokio::sync::watch::channel(false);
        {
            let death = death.clone();
            let link = link.clone();
            let tenant = tenant.clone();
            let executors = Arc::downgrade(self);
            let handed = handed.clone();
            let record_dir = self.spec.rendezvous.clone().filter(|_| adoptable);
            std::thread::Builder::new()
                .name(format!("salus-reap-{pid}"))
                .spawn(move || {
                    let status = wait_watching_stops(&mut child, &link);
                    if let Some(dir) = &record_dir {
                        ExecutorRecord::remove(dir, serial);
                    }
                    let clean = status.as_ref().is_ok_and(|s| s.success());
                    // The last lines explain the death: wait until they are read.
                    if let Some(ended) = stderr_ended {
                        let _ = ended.recv_timeout(Duration::from_secs(2));
                    }
                    let message = death_message(&tenant, pid, status, &last_lines);
                    link.die();
                    death.record(message.clone());
                    let _ = exited_tx.send(true);
                    let why = match executors.upgrade() {
                        Some(executors) => executors.reaped(&tenant, pid, clean, &message),
                        None => (!clean).then(|| message.clone()),
                    };
                    // After `reaped`: a client that retries on a new connection
                    // reaches a successor that knows how this one ended.
                    handed.end_all(why.as_deref());
                })
                .map_err(|e| format!("cannot start a reaper thread: {e}"))?;
        }
        // Err(Some(why)): it started but cannot serve; Err(None): it did not start.
        let started: Result<(), Option<String>> = tokio::select! {
            hello = hello => match hello {
                Ok(hello) => compatible(&hello).map_err(|why| {
                    process.signal_or_log(libc::SIGKILL);
                    Some(why)
                }),
                Err(_) => Err(None),
            },
            _ = exited_rx.wait_for(|exited| *exited) => Err(None),
            () = tokio::time::sleep(self.spec.start_timeout) => {
                process.signal_or_log(libc::SIGKILL);
                Err(None)
            }
        };
        if let Err(refused) = started {
            // The reaper counts the failure: the process is gone, or killed above.
            let why = match refused {
                Some(why) => why,
                None => death
                    .wait(Duration::from_secs(5))
                    .await
                    .unwrap_or_else(|| "it did not start in time".into()),
            };
            return Err(format!(
                "the executor process for tenant {tenant} did not start: {why}"
            ));
        }
        let sender = relay_sender(h2_ours, &tenant).await?;
        self.counts.started.fetch_add(1, Ordering::Relaxed);
        let started_in = began.elapsed();
        tracing::info!(tenant = %tenant, pid, uid, started_ms = started_in.as_millis() as u64, "executor started");
        Ok(Arc::new(ExecutorHandle {
            tenant,
            pid,
            sender,
            handover: Arc::new(handover_ours),
            handed,
            link,
            death,
            in_flight: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            release: env!("CARGO_PKG_VERSION").into(),
            adopted: false,
        }))
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
fn wait_watching_stops(
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

/// The socket of executor `serial`'s rendezvous, bound in `dir` but not yet
/// listening, and its secret. The executor calls listen(2) itself, after it
/// became its tenant's user: a peer's credentials (`SO_PEERCRED`) are those of
/// the process that listened, so the next supervisor sees the executor's pid
/// and uid on it, not this process's.
fn rendezvous_socket(dir: &std::path::Path, serial: u64) -> Result<(OwnedFd, String), String> {
    let path = ExecutorRecord::socket_path(dir, serial);
    let _ = std::fs::remove_file(&path);
    let socket = crate::seam::adoption::bound_socket(&path).map_err(|e| {
        format!(
            "cannot bind the executor's rendezvous {}: {e}",
            path.display()
        )
    })?;
    let secret = crate::seam::adoption::new_secret()
        .map_err(|e| format!("cannot make the executor's secret: {e}"))?;
    Ok((socket, secret))
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
