//! A tenant's executor process (`salus-server ... executor`, started by the
//! supervisor, not by users): the whole job runtime and TensorFlow for one
//! tenant, serving its clients' connections, which the supervisor hands over
//! on fd 5 ([`incoming`]), and the calls it relays on fd 3, and asking the
//! supervisor's scheduler and admission over the seam on fd 4.
//!
//! [`drop_privileges`] runs first thing in `main`, before any thread: the
//! process becomes the tenant's user (its groups, no capabilities, no new
//! privileges, its home as working directory) and takes its memory limit.

pub mod incoming;
pub mod rendezvous;

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::config::Config;
use crate::seam::client::{SeamClient, WhenOrphaned};
use crate::seam::msg;
use crate::server::{Role, ServeError, Server};
use crate::seam::contract::{env, H2_FD, HANDOVER_FD, SEAM_FD};
use crate::tenant::CheckpointRoot;
use crate::tenant::identity::{Tenant, TenantKey};

/// Whether this process was started as an executor (its last argument).
pub fn is_executor_invocation() -> bool {
    std::env::args_os().last().is_some_and(|a| a == "executor")
}

/// Why an executor could not become its tenant's user (it exits: the
/// supervisor reports its death).
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("{var}={value:?} is not a byte count")]
    BadMemory { var: &'static str, value: String },
    #[error("cannot set the executor's memory limit: {0}")]
    MemoryLimit(std::io::Error),
    #[error("{var}={spec:?} is malformed")]
    MalformedRunAs { var: &'static str, spec: String },
    #[error("{var}: {value:?} is not a number")]
    NotANumber { var: &'static str, value: String },
    #[error("{call} failed: {source}")]
    Syscall {
        call: &'static str,
        source: std::io::Error,
    },
    #[error("the user switch did not take effect")]
    NotSwitched,
    #[error("root could be regained after the user switch")]
    RootRegainable,
    #[error("home directory with a NUL")]
    NulInHome,
}

/// Becomes the tenant's user and takes the memory limit, as the supervisor
/// asked in the environment. Must run before any other thread starts.
pub fn drop_privileges() -> Result<(), PrivilegeError> {
    rendezvous::take_ticket();
    if let Ok(bytes) = std::env::var(env::MEMORY) {
        let bytes: u64 = bytes
            .parse()
            .map_err(|_| PrivilegeError::BadMemory {
                var: env::MEMORY,
                value: bytes.clone(),
            })?;
        let limit = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: bytes,
        };
        // RLIMIT_DATA covers the heap and private anonymous mappings: what a
        // runaway allocation grows. An allocation beyond it fails (TensorFlow
        // then aborts: the tenant's executor, not the server).
        // SAFETY: plain syscall with a valid struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
            return Err(PrivilegeError::MemoryLimit(
                std::io::Error::last_os_error(),
            ));
        }
    }
    let Ok(spec) = std::env::var(env::RUN_AS) else {
        return Ok(());
    };
    let fields: Vec<&str> = spec.splitn(4, ':').collect();
    let [uid, gid, groups, home] = fields[..] else {
        return Err(PrivilegeError::MalformedRunAs {
            var: env::RUN_AS,
            spec,
        });
    };
    let number = |s: &str| {
        s.parse::<u32>().map_err(|_| PrivilegeError::NotANumber {
            var: env::RUN_AS,
            value: s.to_string(),
        })
    };
    let uid = number(uid)?;
    let gid = number(gid)?;
    let groups: Vec<libc::gid_t> = groups
        .split(',')
        .filter(|g| !g.is_empty())
        .map(number)
        .collect::<Result<_, _>>()?;
    let os_error = |call: &'static str| PrivilegeError::Syscall {
        call,
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: plain syscalls with valid arguments; the order (groups, gid,
    // then uid) is the only one that works once root is given up.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            return Err(os_error("setgroups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(os_error("setresgid"));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(os_error("setresuid"));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(os_error("prctl(PR_SET_NO_NEW_PRIVS)"));
        }
        if libc::getuid() != uid || libc::geteuid() != uid || libc::getegid() != gid {
            return Err(PrivilegeError::NotSwitched);
        }
        if uid != 0 && libc::setuid(0) == 0 {
            return Err(PrivilegeError::RootRegainable);
        }
    }
    let home_c = CString::new(home).map_err(|_| PrivilegeError::NulInHome)?;
    // SAFETY: valid C string.
    let at_home = unsafe { libc::chdir(home_c.as_ptr()) } == 0;
    if !at_home {
        // SAFETY: as above.
        unsafe { libc::chdir(c"/".as_ptr()) };
    }
    // Single-threaded still: setting the environment is safe.
    std::env::set_var("HOME", home);
    if let Some(account) = crate::tenant::users::Account::by_uid(uid) {
        std::env::set_var("USER", &account.name);
        std::env::set_var("LOGNAME", &account.name);
    }
    Ok(())
}

fn tenant_from_env() -> Result<Tenant, String> {
    let name = std::env::var(env::TENANT_NAME).map_err(|_| {
        "the executor subcommand is started by salus-server itself (--isolation tenant), not by users"
            .to_string()
    })?;
    let key = TenantKey::from_text(&std::env::var(env::TENANT_KEY).unwrap_or_default())?;
    // Its user looked up once, at the executor's start.
    Ok(Tenant::of_key(key, name))
}

pub(crate) fn socket_fd(fd: i32) -> Result<(), String> {
    // SAFETY: fstat on an fd number with a valid out-parameter.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!(
            "fd {fd} is not a socket: the executor subcommand is started by salus-server itself, not by users"
        ));
    }
    Ok(())
}

/// Runs the executor until `shutdown` (SIGTERM from the supervisor) or until
/// the supervisor is gone.
pub async fn run(
    mut config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    let tenant = Arc::new(tenant_from_env()?);
    // Relative paths in the flags meant the server's working directory, not
    // this process's (its user's home): the supervisor sends them absolute.
    if let Ok(base) = std::env::var(env::CHECKPOINT_BASE) {
        config.tenant.checkpoints = CheckpointRoot::PerJob(base.into());
    }
    if let Ok(root) = std::env::var(env::CHECKPOINT_ROOT) {
        config.tenant.checkpoints = CheckpointRoot::Shared(root.into());
    }
    let job_base: u64 = std::env::var(env::JOB_BASE)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    if let Ok(note) = std::env::var(env::PREDECESSOR) {
        crate::runtime::jobs::note_predecessor_death(note);
    }
    socket_fd(H2_FD)?;
    socket_fd(SEAM_FD)?;
    socket_fd(HANDOVER_FD)?;
    // SAFETY: the fds are sockets the supervisor handed over, owned by nobody else here.
    let (h2, seam, handover) = unsafe {
        (
            std::os::unix::net::UnixStream::from_raw_fd(H2_FD),
            std::os::unix::net::UnixStream::from_raw_fd(SEAM_FD),
            OwnedFd::from_raw_fd(HANDOVER_FD),
        )
    };
    // The supervisor is gone, and with it the scheduler and admission. Where
    // nothing can adopt this executor it ends at once, as the server did:
    // clients of handed-over connections see them close (as with a killed
    // server), not answers from a process on its way out; exit handlers would
    // let other threads answer meanwhile.
    // SAFETY: _exit ends the process; nothing runs after it.
    let exit = || unsafe { libc::_exit(0) };
    let rendezvous = rendezvous::listener().filter(|_| !config.adopt_grace.is_zero());
    let seam = match &rendezvous {
        Some(_) => SeamClient::start_orphanable(
            seam,
            WhenOrphaned::Wait {
                grace: config.adopt_grace,
                exit: Box::new(exit),
            },
        ),
        None => SeamClient::start(seam, exit),
    }
    .map_err(|e| format!("cannot read the seam: {e}"))?;
    let server = Server::start_as(
        config,
        Role::Executor {
            seam: seam.clone(),
            job_base,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let state = server.state().clone();
    seam.set_reporter(Box::new(move || state.executor_report()));
    let (arrivals, arriving) = tokio::sync::mpsc::unbounded_channel();
    let _ = arrivals.send(incoming::Arrival::Relay(h2));
    incoming::handed_over(handover, arrivals.clone()).map_err(|e| e.to_string())?;
    if let Some((listener, ticket)) = rendezvous {
        rendezvous::serve(listener, ticket, seam.clone(), arrivals)
            .map_err(|e| format!("cannot serve the rendezvous: {e}"))?;
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    tracing::info!(tenant = %tenant, uid, "executor serving");
    seam.send(msg::to_supervisor::Msg::Hello(msg::Hello {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        uid,
        protocol: crate::seam::PROTOCOL,
        adoption: None,
        answers_pings: true,
    }));
    server
        .serve_executor(incoming::connections(arriving), tenant, shutdown)
        .await
        .map_err(|e: ServeError| e.to_string())
}
