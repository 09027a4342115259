//! An executor process, named by a pidfd rather than its pid: a signal sent
//! through it reaches that process or fails, never a process that reused
//! its pid after it was reaped (the tenant owns its executor and can end it
//! at any moment, so the supervisor must not race the reaper with `kill`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub struct ExecutorProcess {
    pid: u32,
    /// None only where the kernel has no pidfds (before Linux 5.3).
    fd: Option<OwnedFd>,
}

impl ExecutorProcess {
    /// Names process `pid`; call it while `pid` cannot have been reused (a
    /// child not yet reaped, or a process just proven to be the executor).
    pub fn open(pid: u32) -> ExecutorProcess {
        // SAFETY: pidfd_open takes a pid and flags; a returned fd is ours.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as i32) });
        if fd.is_none() {
            tracing::warn!(
                pid,
                cause = %io::Error::last_os_error(),
                "no pidfd for an executor: signals to it go by pid"
            );
        }
        ExecutorProcess { pid, fd }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pidfd, readable once the process has ended.
    pub fn fd(&self) -> Option<&OwnedFd> {
        self.fd.as_ref()
    }

    /// Sends `signal`; an ended process gives `ESRCH`, whoever has its pid now.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let rc = match &self.fd {
            // SAFETY: a pidfd we own, a signal number, no siginfo, no flags.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                ) as i32
            },
            // SAFETY: kill takes a pid and a signal number.
            None => unsafe { libc::kill(self.pid as libc::pid_t, signal) },
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `signal`, logging a failure other than the process having ended.
    pub fn signal_or_log(&self, signal: i32) {
        if let Err(err) = self.signal(signal) {
            if err.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(pid = self.pid, signal, cause = %err, "cannot signal an executor");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaped_process_is_never_signalled_again() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let process = ExecutorProcess::open(child.id());
        assert!(process.fd().is_some(), "this kernel has pidfds");
        process.signal(0).expect("alive");
        process.signal(libc::SIGKILL).unwrap();
        child.wait().unwrap();
        // Reaped: its pid may be anyone's now; the pidfd still names it.
        let err = process.signal(libc::SIGKILL).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
    }
}
