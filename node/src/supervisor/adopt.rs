//! A new supervisor adopts the executors its predecessor left running (after
//! SIGTERM, SIGKILL, a crash or an upgrade), before it serves its first
//! connection: each record of the state directory's rendezvous
//! (`seam::adoption`) is checked (the peer is the recorded process, running as
//! the recorded uid, and knows the secret), given new sockets, and its replay
//! of what the old supervisor knew goes into this supervisor's core and
//! admission through an ordinary [`Link`], which checks it as it checks any
//! other message of an executor.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::seam::adoption::{self, same_secret, ExecutorRecord};
use crate::seam::frame::read_frame;
use crate::seam::msg::{self, to_supervisor};
use crate::supervisor::death::{death_message, DeathNote};
use crate::supervisor::executor_log::forward_stderr;
use crate::supervisor::executors::{
    relay_sender, set_send_timeout, ExecutorHandle, Executors, Slot, HANDOVER_TIMEOUT,
};
use crate::supervisor::handed::HandedConnections;
use crate::supervisor::link::Link;
use crate::supervisor::pidfd::ExecutorProcess;
use crate::sync::lock;
use crate::tenant::identity::{Tenant, TenantKey};

/// Longest wait for an executor's answer during its adoption.
const ADOPTION_TIMEOUT: Duration = Duration::from_secs(10);

impl Executors {
    /// Adopts every executor the state directory's rendezvous names; returns
    /// how many were adopted. Records of executors that are gone are removed.
    pub async fn adopt_orphans(self: &Arc<Self>) -> usize {
        let Some(dir) = self.spec.rendezvous.clone() else {
            return 0;
        };
        let records = ExecutorRecord::list(&dir);
        // New executors number on from the highest serial on record.
        if let Some(last) = records.iter().map(|r| r.serial).max() {
            self.serial.fetch_max(last, Ordering::SeqCst);
        }
        let mut adopted = 0;
        // All at once: one that does not answer (its tenant stopped it) costs
        // the start one ADOPTION_TIMEOUT, not one each.
        let mut handshakes = tokio::task::JoinSet::new();
        for record in records {
            let executors = self.clone();
            handshakes.spawn(async move {
                let who = (record.serial, record.pid, record.tenant_name.clone());
                (who, executors.adopt(record).await)
            });
        }
        while let Some(done) = handshakes.join_next().await {
            let Ok(((serial, pid, tenant_name), outcome)) = done else {
                continue;
            };
            match outcome {
                Ok(handle) => {
                    let key = handle.tenant.key.clone();
                    let slot = Arc::new(Slot::default());
                    let _ = slot.cell.set(handle.clone());
                    let mut slots = lock(&self.slots);
                    if slots.contains_key(&key) {
                        // Two executors of one tenant: the first keeps its
                        // calls; this one's jobs still run and are scheduled.
                        tracing::warn!(tenant = %tenant_name, pid, "a second executor of one tenant adopted");
                        slots.insert(TenantKey::Named(format!("{key:?}#{serial}")), slot);
                    } else {
                        slots.insert(key, slot);
                    }
                    adopted += 1;
                    tracing::info!(
                        tenant = %tenant_name,
                        pid,
                        release = %handle.release,
                        "adopted a running executor"
                    );
                }
                Err(why) => {
                    tracing::warn!(tenant = %tenant_name, pid, serial, "not adopted: {why}");
                    ExecutorRecord::remove(&dir, serial);
                }
            }
        }
        adopted
    }

    async fn adopt(
        self: &Arc<Self>,
        record: ExecutorRecord,
    ) -> Result<Arc<ExecutorHandle>, String> {
        let dir = self.spec.rendezvous.clone().ok_or("no rendezvous")?;
        let tenant = Arc::new(tenant_of(&record)?);
        // The recorded uid must be the one this supervisor runs the tenant as
        // (for a token tenant without a user: its uid of --tenant-uid-range),
        // so a record naming another uid (an executor of a release that ran
        // such tenants as nobody, or a forged record) adopts nothing.
        let expected = match self.credentials(&tenant)? {
            Some((account, _)) => account.uid,
            // SAFETY: geteuid cannot fail.
            None => unsafe { libc::geteuid() },
        };
        if record.uid != expected {
            return Err(format!(
                "it runs as uid {}, and tenant {tenant}'s executor runs as uid {expected} on this server",
                record.uid
            ));
        }
        let path = ExecutorRecord::socket_path(&dir, record.serial);
        let expected = record.clone();
        let handshake = tokio::task::spawn_blocking(move || handshake(&path, &expected))
            .await
            .map_err(|e| e.to_string())??;
        let Handshake {
            seam,
            h2,
            handover,
            log,
            hello,
        } = handshake;
        let pid = record.pid;
        let label = format!("{}:{pid}", tenant.name);
        let last_lines = Arc::new(Mutex::new(VecDeque::new()));
        let log_ended = forward_stderr(
            std::fs::File::from(log),
            label.clone(),
            last_lines.clone(),
            self.spec.verbose,
            self.spec.log_rate,
        );
        // The handshake proved this pid is the executor (SO_PEERCRED) and
        // its socket keeps it from being reaped meanwhile.
        let process = Arc::new(ExecutorProcess::open(pid));
        let (link, _) = Link::start(
            seam,
            self.executor.clone(),
            self.admission.clone(),
            self.runtime.clone(),
            self.link_spec(label, &tenant, record.serial, process),
        )
        .map_err(|e| format!("cannot watch it: {e}"))?;
        link.set_answers_pings(hello.answers_pings);
        let death = Arc::new(DeathNote::default());
        let handed = Arc::new(HandedConnections::default());
        watch_adopted(
            self,
            pid,
            record.serial,
            tenant.clone(),
            link.clone(),
            death.clone(),
            handed.clone(),
            last_lines,
            log_ended,
        )?;
        let sender = relay_sender(h2, &tenant).await?;
        Ok(Arc::new(ExecutorHandle {
            tenant,
            pid,
            sender,
            handover: Arc::new(handover),
            handed,
            link,
            death,
            in_flight: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            release: hello.version,
            adopted: true,
        }))
    }
}

fn tenant_of(record: &ExecutorRecord) -> Result<Tenant, String> {
    let key = TenantKey::from_text(&record.tenant_key)?;
    Ok(Tenant::of_key(key, record.tenant_name.clone()))
}

struct Handshake {
    seam: UnixStream,
    h2: UnixStream,
    handover: OwnedFd,
    log: OwnedFd,
    hello: msg::Hello,
}

/// Connects to an executor's rendezvous, checks who answers, passes it new
/// sockets and reads its Hello (its replay follows on the same stream).
fn handshake(path: &std::path::Path, record: &ExecutorRecord) -> Result<Handshake, String> {
    let mut stream = adoption::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
            "the executor is gone".to_string()
        }
        _ => format!("cannot reach its rendezvous: {e}"),
    })?;
    let (pid, uid) = adoption::peer(&stream).map_err(|e| e.to_string())?;
    if pid != record.pid || uid != record.uid {
        return Err(format!(
            "its rendezvous is held by pid {pid} uid {uid}, not the recorded pid {} uid {}",
            record.pid, record.uid
        ));
    }
    let (h2_ours, h2_theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    let (handover_ours, handover_theirs) =
        crate::seam::handover::pair().map_err(|e| e.to_string())?;
    set_send_timeout(&handover_ours, HANDOVER_TIMEOUT).map_err(|e| e.to_string())?;
    let mut pipe = [0; 2];
    // SAFETY: pipe2 fills two fds, owned below.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: fresh fds from pipe2, owned by nobody else.
    let (log_read, log_write) =
        unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
    adoption::send_fds(
        &stream,
        &[
            h2_theirs.as_raw_fd(),
            handover_theirs.as_raw_fd(),
            log_write.as_raw_fd(),
        ],
    )
    .map_err(|e| format!("cannot pass it its sockets: {e}"))?;
    drop((h2_theirs, handover_theirs, log_write));
    stream
        .set_read_timeout(Some(ADOPTION_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = match read_frame::<_, msg::ToSupervisor>(&mut stream) {
        Ok(Some(msg::ToSupervisor {
            msg: Some(to_supervisor::Msg::Hello(hello)),
        })) => hello,
        Ok(_) => return Err("it did not say Hello".into()),
        Err(e) => return Err(format!("it did not answer: {e}")),
    };
    let proof = hello.adoption.as_ref().ok_or("its Hello has no adoption")?;
    if !same_secret(&proof.secret, &record.secret) || proof.serial != record.serial {
        return Err("it does not hold the secret its supervisor left for it".into());
    }
    if hello.protocol != crate::seam::PROTOCOL {
        return Err(format!(
            "it speaks seam protocol {} (salus-server {}), this supervisor {} ({}): it cannot be adopted",
            hello.protocol,
            hello.version,
            crate::seam::PROTOCOL,
            env!("CARGO_PKG_VERSION")
        ));
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(Handshake {
        seam: stream,
        h2: h2_ours,
        handover: handover_ours,
        log: log_read,
        hello,
    })
}

/// Watches an adopted executor, which may not be this process's child (after
/// a restart it is init's): its end is seen through a pidfd, and reaped here
/// when it is a child (an in-place upgrade keeps the pid).
#[allow(clippy::too_many_arguments)]
fn watch_adopted(
    executors: &Arc<Executors>,
    pid: u32,
    serial: u64,
    tenant: Arc<Tenant>,
    link: Arc<Link>,
    death: Arc<DeathNote>,
    handed: Arc<HandedConnections>,
    last_lines: Arc<Mutex<VecDeque<String>>>,
    log_ended: std::sync::mpsc::Receiver<()>,
) -> Result<(), String> {
    let executors = Arc::downgrade(executors);
    let record_dir = executors.upgrade().and_then(|e| e.spec.rendezvous.clone());
    std::thread::Builder::new()
        .name(format!("salus-reap-{pid}"))
        .spawn(move || {
            if let Some(pidfd) = link.process().fd() {
                let mut poll = libc::pollfd {
                    fd: pidfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; -1: no timeout.
                while unsafe { libc::poll(&mut poll, 1, -1) } < 0 {}
            }
            let mut status = 0;
            // SAFETY: waitpid with a valid out-parameter; WNOHANG: it has ended.
            let reaped = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
            let status = if reaped == pid as libc::pid_t {
                use std::os::unix::process::ExitStatusExt;
                Ok(std::process::ExitStatus::from_raw(status))
            } else {
                Err(std::io::Error::other(
                    "it was adopted from an earlier supervisor, which alone could see how it ended",
                ))
            };
            let clean = match &status {
                Ok(status) => status.success(),
                // Not this process's child: it ended cleanly if it was asked to
                // (the server stopping, or its slot given up: idle, revoked).
                Err(_) => executors
                    .upgrade()
                    .is_none_or(|e| e.is_closing() || !e.holds(pid)),
            };
            if let Some(dir) = &record_dir {
                ExecutorRecord::remove(dir, serial);
            }
            let _ = log_ended.recv_timeout(Duration::from_secs(2));
            let message = death_message(&tenant, pid, status, &last_lines);
            link.die();
            death.record(message.clone());
            let why = match executors.upgrade() {
                Some(executors) => executors.reaped(&tenant, pid, clean, &message),
                None => (!clean).then(|| message.clone()),
            };
            handed.end_all(why.as_deref());
        })
        .map_err(|e| format!("cannot start a reaper thread: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::frame::write_frame;

    /// A stand-in executor on a rendezvous at `path`: accepts one supervisor,
    /// takes its sockets and says `hello`.
    fn fake_executor(path: &std::path::Path, hello: msg::Hello) -> std::thread::JoinHandle<usize> {
        let listener = adoption::listen(adoption::bound_socket(path).unwrap()).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let fds = adoption::recv_fds(&stream, adoption::ADOPTION_FDS).unwrap();
            let frame = msg::ToSupervisor {
                msg: Some(to_supervisor::Msg::Hello(hello)),
            };
            let _ = write_frame(&mut stream, &frame);
            fds.len()
        })
    }

    fn record(secret: &str) -> ExecutorRecord {
        ExecutorRecord {
            serial: 3,
            pid: std::process::id(),
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            tenant_key: "name:t".into(),
            tenant_name: "t".into(),
            secret: secret.into(),
            release: "0.0.9".into(),
        }
    }

    fn hello(secret: &str, version: &str, protocol: u32) -> msg::Hello {
        msg::Hello {
            version: version.into(),
            pid: std::process::id(),
            uid: 0,
            protocol,
            adoption: Some(msg::Adoption {
                secret: secret.into(),
                serial: 3,
            }),
            answers_pings: true,
        }
    }

    #[test]
    fn only_the_recorded_executor_with_its_secret_and_protocol_is_adopted() {
        let dir = crate::state_dir::temp_dir("adopt");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("3.sock");
        let secret = adoption::new_secret().unwrap();
        let attempt = |hello: msg::Hello, record: &ExecutorRecord| {
            let _ = std::fs::remove_file(&path);
            let executor = fake_executor(&path, hello);
            let outcome = handshake(&path, record).map(|h| h.hello.version);
            (outcome, executor.join().unwrap())
        };

        // The previous release, speaking this protocol, with its secret: adopted, and given its three sockets.
        let (adopted, sockets) = attempt(
            hello(&secret, "0.0.9", crate::seam::PROTOCOL),
            &record(&secret),
        );
        assert_eq!(adopted.unwrap(), "0.0.9");
        assert_eq!(sockets, adoption::ADOPTION_FDS);

        let (wrong_secret, _) = attempt(
            hello(
                &adoption::new_secret().unwrap(),
                "0.0.9",
                crate::seam::PROTOCOL,
            ),
            &record(&secret),
        );
        assert!(wrong_secret.unwrap_err().contains("secret"));

        let (other_protocol, _) = attempt(
            hello(&secret, "0.0.9", crate::seam::PROTOCOL + 1),
            &record(&secret),
        );
        assert!(other_protocol.unwrap_err().contains("protocol"));

        // The socket's listener is not the recorded process.
        let mut elsewhere = record(&secret);
        elsewhere.pid += 1;
        let _ = std::fs::remove_file(&path);
        let _listener = adoption::listen(adoption::bound_socket(&path).unwrap()).unwrap();
        let why = handshake(&path, &elsewhere).err().unwrap();
        assert!(why.contains("not the recorded pid"), "{why}");

        // Nobody listens: the executor is gone.
        drop(_listener);
        let why = handshake(&path, &record(&secret)).err().unwrap();
        assert_eq!(why, "the executor is gone");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
