//! Listening sockets a process is started with instead of binding its own:
//! systemd's socket activation (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`;
//! `sd_listen_fds(3)`), which an in-place upgrade uses too (the supervisor
//! execs the new binary with its sockets on fds 3 and 4). The socket
//! outlives the process, so no client is refused while it restarts.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// What marks a keeper process (`supervisor::keeper`): the path of the
/// socket it serves the listeners on.
pub const KEEPER_ENV: &str = "SALUS_KEEP_LISTENERS";
/// A keeper's socket, in the state directory's rendezvous folder.
pub const KEEPER_SOCKET: &str = "listeners.sock";

/// Set by an in-place upgrade beside `LISTEN_FDS` (the sockets are the old
/// supervisor's, not systemd's).
pub const UPGRADED_ENV: &str = "SALUS_UPGRADED";

/// The first fd of the protocol.
const FIRST_FD: RawFd = 3;

/// The sockets this process was started with, by role.
#[derive(Default)]
pub struct Activated {
    pub api: Option<std::net::TcpListener>,
    pub metrics: Option<std::net::TcpListener>,
    /// They are a supervisor's that upgraded in place, not systemd's.
    pub upgraded: bool,
}

/// Takes the sockets passed by `LISTEN_FDS` (once: the variables are removed,
/// so children do not see them; call it before any thread starts). The first is the API's; a second is the
/// metrics endpoint's, unless `LISTEN_FDNAMES` names them (`api`, `metrics`).
pub fn take() -> Activated {
    let pid = std::env::var("LISTEN_PID").ok();
    let count = std::env::var("LISTEN_FDS").ok();
    let names = std::env::var("LISTEN_FDNAMES").ok();
    let upgraded = std::env::var_os(UPGRADED_ENV).is_some();
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", UPGRADED_ENV] {
        std::env::remove_var(var);
    }
    let ours = pid.and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let Some(count) = count.and_then(|c| c.parse::<RawFd>().ok()).filter(|_| ours) else {
        return Activated::default();
    };
    let names: Vec<String> = names
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let mut activated = Activated {
        upgraded,
        ..Activated::default()
    };
    for (i, fd) in (FIRST_FD..FIRST_FD + count.clamp(0, 16)).enumerate() {
        if !is_listening_tcp(fd) {
            tracing::warn!(
                fd,
                "a socket passed in LISTEN_FDS is no listening TCP socket: ignored"
            );
            continue;
        }
        // SAFETY: the fd was passed to this process for it to own (sd_listen_fds).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        set_cloexec(fd);
        let listener = std::net::TcpListener::from(owned);
        let role =
            names
                .get(i)
                .map(String::as_str)
                .unwrap_or(if i == 0 { "api" } else { "metrics" });
        match role {
            "metrics" => activated.metrics = Some(listener),
            _ if activated.api.is_none() => activated.api = Some(listener),
            _ => activated.metrics = Some(listener),
        }
    }
    activated
}

fn is_listening_tcp(fd: RawFd) -> bool {
    let accepting = socket_option(fd, libc::SO_ACCEPTCONN);
    let domain = socket_option(fd, libc::SO_DOMAIN);
    accepting.is_some_and(|a| a != 0)
        && domain.is_some_and(|d| d == libc::AF_INET || d == libc::AF_INET6)
}

/// An integer socket option of `fd` (None: not a socket).
fn socket_option(fd: RawFd, option: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt with a valid out-parameter of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on an fd this process owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

/// Whether `held` (a socket passed in) serves `wanted` (the configured
/// address): the same address, where port 0 in `wanted` accepts any port.
pub fn serves(held: &std::net::TcpListener, wanted: std::net::SocketAddr) -> bool {
    let Ok(at) = held.local_addr() else {
        return false;
    };
    at.ip() == wanted.ip() && (wanted.port() == 0 || at.port() == wanted.port())
}

/// The sockets a keeper holds for this rendezvous, if one runs: (api, metrics).
pub fn take_from_keeper(
    rendezvous: &Path,
) -> Option<(std::net::TcpListener, Option<std::net::TcpListener>)> {
    let stream = crate::seam::adoption::connect(&rendezvous.join(KEEPER_SOCKET)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let fds = crate::seam::adoption::recv_fds(&stream, 2).ok()?;
    // Got them: the keeper may go.
    let _ = std::io::Write::write(&mut &stream, &[1]);
    let mut fds = fds.into_iter();
    let api = std::net::TcpListener::from(fds.next()?);
    let second = std::net::TcpListener::from(fds.next()?);
    // The keeper passes the API's socket twice when there is no metrics endpoint.
    let metrics = (second.local_addr().ok() != api.local_addr().ok()).then_some(second);
    Some((api, metrics))
}
