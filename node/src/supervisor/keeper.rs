//! The listening sockets across a restart, where no systemd socket unit holds
//! them: a supervisor that stops for a restart (SIGTERM) hands them to a small
//! keeper process (this binary again, `SALUS_KEEP_LISTENERS` set), which holds
//! them, so clients that connect meanwhile wait in the kernel's backlog
//! instead of being refused, until the next supervisor on the same state
//! directory takes them (or `--adopt-grace` passes and the keeper exits). An
//! in-place upgrade (SIGUSR2) execs the new binary with them instead
//! (`listen_fds`).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::seam::adoption;

pub use crate::listen_fds::KEEPER_ENV as ENV;
use crate::listen_fds::KEEPER_SOCKET as SOCKET;
/// How long it keeps them, in seconds.
const GRACE_ENV: &str = "SALUS_KEEP_GRACE";

/// The sockets a supervisor listens on, as fds it can pass on.
pub struct HeldListeners {
    pub api: OwnedFd,
    pub metrics: Option<OwnedFd>,
}

/// A duplicate of a listener's fd (close-on-exec).
pub fn dup_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC of an fd this process owns; the new one is owned below.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(copy) })
}

/// Starts a keeper holding `held` for up to `grace` (blocking only for the spawn).
pub fn hand_to_keeper(
    binary: &Path,
    rendezvous: &Path,
    held: &HeldListeners,
    grace: Duration,
) -> std::io::Result<u32> {
    let api = held.api.as_raw_fd();
    let metrics = held.metrics.as_ref().map_or(api, |m| m.as_raw_fd());
    let mut command = std::process::Command::new(binary);
    command
        .env_clear()
        .env(ENV, rendezvous.join(SOCKET))
        .env(GRACE_ENV, grace.as_secs().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    // SAFETY: only async-signal-safe calls (setsid, fcntl, dup2) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            let a = libc::fcntl(api, libc::F_DUPFD_CLOEXEC, 10);
            let m = libc::fcntl(metrics, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || m < 0 || libc::dup2(a, 3) < 0 || libc::dup2(m, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command.spawn()?.id())
}

/// The keeper process (the binary's `main` calls this first when [`ENV`] is
/// set): serves fds 3 and 4 to the first process of the server's user that
/// asks, then exits; or exits when the grace has passed.
pub fn keep() -> ! {
    let path = PathBuf::from(std::env::var_os(ENV).unwrap_or_default());
    let grace = std::env::var(GRACE_ENV)
        .ok()
        .and_then(|g| g.parse().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    let _ = std::fs::remove_file(&path);
    let Ok(listener) = adoption::with_short_path(&path, |p| UnixListener::bind(p)) else {
        std::process::exit(1);
    };
    let _ = listener.set_nonblocking(true);
    let until = Instant::now() + grace;
    // SAFETY: geteuid cannot fail.
    let own = unsafe { libc::geteuid() };
    while Instant::now() < until {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if adoption::peer(&stream).is_ok_and(|(_, uid)| uid == own)
                    && adoption::send_fds(&stream, &[3, 4]).is_ok()
                {
                    // Wait for the new supervisor to have them before closing ours.
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = std::io::Read::read(&mut &stream, &mut [0u8; 1]);
                    break;
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = std::fs::remove_file(&path);
    std::process::exit(0)
}
