//! Starting a tenant's executor process, step by step: who it runs as and
//! its home, its sockets, its command line and environment, the fds it
//! inherits, its record for a later adoption, its reaper, and its Hello.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::seam::adoption::ExecutorRecord;
use crate::seam::contract::{env, ADOPT_FD, H2_FD, HANDOVER_FD, SEAM_FD};
use crate::seam::contract::{PASSED_ENV, PASSED_ENV_PREFIXES};
use crate::seam::msg;
use crate::supervisor::death::{death_message, DeathNote};
use crate::supervisor::executor_log::forward_stderr;
use crate::supervisor::handed::HandedConnections;
use crate::supervisor::link::Link;
use crate::supervisor::pidfd::ExecutorProcess;
use crate::sync::lock;
use crate::tenant::identity::{Tenant, TenantKey};
use crate::tenant::users::Account;

use super::checkpoint_dir::{checkpoint_subdir, prepare_checkpoint_dir};
use super::executors::{
    compatible, job_ids, relay_sender, set_send_timeout, wait_watching_stops, ExecutorHandle,
    Executors, StartError, HANDOVER_TIMEOUT,
};

/// The socket pairs between the supervisor and one executor: ours, and the
/// ends the child inherits (closed here once it runs).
struct Sockets {
    h2_ours: UnixStream,
    h2_theirs: UnixStream,
    seam_ours: UnixStream,
    seam_theirs: UnixStream,
    handover_ours: OwnedFd,
    handover_theirs: OwnedFd,
}

impl Sockets {
    fn pairs() -> Result<Sockets, String> {
        let (h2_ours, h2_theirs) =
            UnixStream::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        let (seam_ours, seam_theirs) =
            UnixStream::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        let (handover_ours, handover_theirs) =
            crate::seam::handover::pair().map_err(|e| format!("cannot make a socketpair: {e}"))?;
        set_send_timeout(&handover_ours, HANDOVER_TIMEOUT)
            .map_err(|e| format!("socket setup failed: {e}"))?;
        Ok(Sockets {
            h2_ours,
            h2_theirs,
            seam_ours,
            seam_theirs,
            handover_ours,
            handover_theirs,
        })
    }
}

/// What the reaper thread of one executor needs.
struct Reaper {
    child: Child,
    link: Arc<Link>,
    tenant: Arc<Tenant>,
    pid: u32,
    serial: u64,
    death: Arc<DeathNote>,
    handed: Arc<HandedConnections>,
    /// Its record, removed when it ends (None: not adoptable).
    record_dir: Option<PathBuf>,
    stderr_ended: Option<std::sync::mpsc::Receiver<()>>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    exited: tokio::sync::watch::Sender<bool>,
}

impl Executors {
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

    pub(super) async fn start(
        self: &Arc<Self>,
        tenant: Arc<Tenant>,
    ) -> Result<Arc<ExecutorHandle>, StartError> {
        let began = Instant::now();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed) + 1;
        if self.closing.load(Ordering::SeqCst) {
            return Err(StartError::ShuttingDown);
        }
        let credentials = self.credentials(&tenant)?;
        let checkpoint_base = self.checkpoint_home(&tenant, credentials.as_ref())?;
        let sockets = Sockets::pairs()?;
        let rendezvous = self.rendezvous(&tenant, serial);
        let (mut command, uid) = self.command(
            &tenant,
            serial,
            checkpoint_base.as_ref(),
            rendezvous.as_ref().map(|(_, secret)| secret.as_str()),
            credentials.as_ref(),
        );
        pass_fds(
            &mut command,
            &sockets,
            rendezvous.as_ref().map(|(l, _)| l.as_raw_fd()),
        );
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start an executor for tenant {tenant}: {e}"))?;
        let Sockets {
            h2_ours,
            h2_theirs,
            seam_ours,
            seam_theirs,
            handover_ours,
            handover_theirs,
        } = sockets;
        // The child's ends are its own now: an executor that dies closes them all.
        drop((h2_theirs, seam_theirs, handover_theirs));
        let pid = child.id();
        // Named before anything could reap it: kills go through the pidfd.
        let process = Arc::new(ExecutorProcess::open(pid));
        let adoptable = rendezvous.is_some();
        if let Some((listener, secret)) = rendezvous {
            drop(listener);
            self.save_record(&tenant, serial, pid, uid, secret);
        }
        let label = format!("{}:{pid}", tenant.name);
        let (stderr_ended, last_lines) = self.forward_log(&mut child, &label);
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
        let (exited, exited_rx) = tokio::sync::watch::channel(false);
        self.spawn_reaper(Reaper {
            child,
            link: link.clone(),
            tenant: tenant.clone(),
            pid,
            serial,
            death: death.clone(),
            handed: handed.clone(),
            record_dir: self.spec.rendezvous.clone().filter(|_| adoptable),
            stderr_ended,
            last_lines,
            exited,
        })?;
        self.await_hello(&tenant, hello, exited_rx, &process, &death)
            .await?;
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

    /// Its stderr, forwarded to ours on a thread of its own; the last lines
    /// kept to explain its death, and a signal when the pipe ends.
    fn forward_log(
        &self,
        child: &mut Child,
        label: &str,
    ) -> (
        Option<std::sync::mpsc::Receiver<()>>,
        Arc<Mutex<VecDeque<String>>>,
    ) {
        let last_lines = Arc::new(Mutex::new(VecDeque::new()));
        let ended = child.stderr.take().map(|stderr| {
            forward_stderr(
                stderr,
                label.to_string(),
                last_lines.clone(),
                self.spec.verbose,
                self.spec.log_rate,
            )
        });
        (ended, last_lines)
    }

    /// The tenant's checkpoint directory under `--checkpoint-base`, made (as
    /// its owner) for a tenant of no Unix user of its own.
    fn checkpoint_home(
        &self,
        tenant: &Tenant,
        credentials: Option<&(Account, Vec<u32>)>,
    ) -> Result<Option<PathBuf>, String> {
        let checkpoint_base = self
            .spec
            .checkpoint_base
            .as_ref()
            .map(|base| base.join(checkpoint_subdir(tenant)));
        if let (Some(base), Some((account, groups))) = (&checkpoint_base, credentials) {
            if tenant.uid.is_none() {
                prepare_checkpoint_dir(base, account, groups)?;
            }
        }
        Ok(checkpoint_base)
    }

    /// Executor `serial`'s rendezvous socket and secret, when executors
    /// outlive this supervisor (`--state-dir`).
    fn rendezvous(&self, tenant: &Tenant, serial: u64) -> Option<(OwnedFd, String)> {
        match rendezvous_socket(self.spec.rendezvous.as_ref()?, serial) {
            Ok(made) => Some(made),
            Err(why) => {
                // It still serves its tenant; only a restart would end its jobs.
                tracing::warn!(tenant = %tenant, "{why}: this executor cannot be adopted after a restart");
                None
            }
        }
    }

    /// The executor's command line and environment, and the uid it will run as.
    fn command(
        &self,
        tenant: &Tenant,
        serial: u64,
        checkpoint_base: Option<&PathBuf>,
        adopt_secret: Option<&str>,
        credentials: Option<&(Account, Vec<u32>)>,
    ) -> (Command, u32) {
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
        if let Some(base) = checkpoint_base {
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
        if let Some(secret) = adopt_secret {
            command
                .env(env::ADOPT_SECRET, secret)
                .env(env::SERIAL, serial.to_string());
        }
        let uid = match credentials {
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
        (command, uid)
    }

    /// The record a restarted supervisor adopts the executor by.
    fn save_record(&self, tenant: &Tenant, serial: u64, pid: u32, uid: u32, secret: String) {
        let Some(dir) = &self.spec.rendezvous else {
            return;
        };
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

    /// Reaps the process whenever it ends, on a thread of its own: books its
    /// end, tells its link and its handed connections why.
    fn spawn_reaper(self: &Arc<Self>, reaper: Reaper) -> Result<(), String> {
        let executors = Arc::downgrade(self);
        let Reaper {
            mut child,
            link,
            tenant,
            pid,
            serial,
            death,
            handed,
            record_dir,
            stderr_ended,
            last_lines,
            exited,
        } = reaper;
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
                let _ = exited.send(true);
                let why = match executors.upgrade() {
                    Some(executors) => executors.reaped(&tenant, pid, clean, &message),
                    None => (!clean).then(|| message.clone()),
                };
                // After `reaped`: a client that retries on a new connection
                // reaches a successor that knows how this one ended.
                handed.end_all(why.as_deref());
            })
            .map_err(|e| format!("cannot start a reaper thread: {e}"))?;
        Ok(())
    }

    /// Waits for the executor's Hello (of this build), its death, or the
    /// start timeout; a refused or late one is killed.
    async fn await_hello(
        &self,
        tenant: &Tenant,
        hello: tokio::sync::oneshot::Receiver<msg::Hello>,
        mut exited: tokio::sync::watch::Receiver<bool>,
        process: &ExecutorProcess,
        death: &DeathNote,
    ) -> Result<(), String> {
        // Err(Some(why)): it started but cannot serve; Err(None): it did not start.
        let started: Result<(), Option<String>> = tokio::select! {
            hello = hello => match hello {
                Ok(hello) => compatible(&hello).map_err(|why| {
                    process.signal_or_log(libc::SIGKILL);
                    Some(why)
                }),
                Err(_) => Err(None),
            },
            _ = exited.wait_for(|exited| *exited) => Err(None),
            () = tokio::time::sleep(self.spec.start_timeout) => {
                process.signal_or_log(libc::SIGKILL);
                Err(None)
            }
        };
        let Err(refused) = started else {
            return Ok(());
        };
        // The reaper counts the failure: the process is gone, or killed above.
        let why = match refused {
            Some(why) => why,
            None => death
                .wait(Duration::from_secs(5))
                .await
                .unwrap_or_else(|| "it did not start in time".into()),
        };
        Err(format!(
            "the executor process for tenant {tenant} did not start: {why}"
        ))
    }
}

/// Gives the child its fds: the HTTP/2 socket, the seam, the handover socket
/// and the rendezvous (when adoptable) at the numbers the seam's contract
/// names, and a session of its own.
fn pass_fds(command: &mut Command, sockets: &Sockets, adopt_fd: Option<i32>) {
    let h2_fd = sockets.h2_theirs.as_raw_fd();
    let seam_fd = sockets.seam_theirs.as_raw_fd();
    let handover_fd = sockets.handover_theirs.as_raw_fd();
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
