//! The executor's end of the rendezvous (`seam::adoption`): once its
//! supervisor is gone, a new one connects to the listening socket it was given
//! (fd 6), passes it new sockets, and takes over the seam.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::executor::incoming::{self, Arrival};
use crate::seam::adoption::{self, ADOPTION_FDS};
use crate::seam::client::SeamClient;
use crate::seam::contract::{env, ADOPT_FD};
use crate::seam::msg;

/// What the supervisor that started this executor gave it to be adopted with.
pub struct AdoptionTicket {
    pub secret: String,
    pub serial: u64,
    /// The server's user: the only one (besides root) a supervisor may connect as.
    pub server_uid: u32,
}

static TICKET: OnceLock<AdoptionTicket> = OnceLock::new();

/// Takes the adoption secret out of the environment (a tenant must not find
/// it there) and notes the server's user, before privileges are dropped.
/// Call it first thing, while the process has one thread.
pub fn take_ticket() {
    let Ok(secret) = std::env::var(env::ADOPT_SECRET) else {
        return;
    };
    // Single-threaded still: changing the environment is safe.
    std::env::remove_var(env::ADOPT_SECRET);
    let serial = std::env::var(env::SERIAL)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: geteuid cannot fail.
    let server_uid = unsafe { libc::geteuid() };
    let _ = TICKET.set(AdoptionTicket {
        secret,
        serial,
        server_uid,
    });
}

/// The rendezvous on fd 6, listening, and the ticket, if this executor can
/// be adopted. It listens only now, as its tenant's user: a supervisor that
/// connects sees this process's pid and uid as its peer.
pub fn listener() -> Option<(UnixListener, &'static AdoptionTicket)> {
    let ticket = TICKET.get()?;
    super::socket_fd(ADOPT_FD).ok()?;
    // SAFETY: fd 6 is the socket the supervisor handed over, owned by nobody else here.
    let socket = unsafe { OwnedFd::from_raw_fd(ADOPT_FD) };
    match adoption::listen(socket) {
        Ok(listener) => Some((listener, ticket)),
        Err(err) => {
            tracing::warn!(cause = %err, "cannot listen on the rendezvous: a restart of the server will end this executor's jobs");
            None
        }
    }
}

/// Serves the rendezvous on a thread of its own: each connection from the
/// server's user while the seam has no supervisor is an adoption.
pub fn serve(
    listener: UnixListener,
    ticket: &'static AdoptionTicket,
    seam: Arc<SeamClient>,
    arrivals: mpsc::UnboundedSender<Arrival>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("salus-rendezvous".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                match adoption::peer(&stream) {
                    Ok((_, uid)) if uid == 0 || uid == ticket.server_uid => {}
                    Ok((pid, uid)) => {
                        tracing::warn!(pid, uid, "refused a rendezvous from a process that is not the server's");
                        continue;
                    }
                    Err(_) => continue,
                }
                if !seam.is_orphaned() {
                    // It has a supervisor: nobody else may take it over.
                    continue;
                }
                match adopt(stream, ticket, &seam, &arrivals) {
                    Ok(()) => tracing::info!("adopted by a new supervisor: its scheduler decides from now on"),
                    Err(err) => tracing::warn!(cause = %err, "an adoption failed: still waiting for a supervisor"),
                }
            }
        })?;
    Ok(())
}

fn adopt(
    stream: UnixStream,
    ticket: &AdoptionTicket,
    seam: &Arc<SeamClient>,
    arrivals: &mpsc::UnboundedSender<Arrival>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let fds = adoption::recv_fds(&stream, ADOPTION_FDS)?;
    stream.set_read_timeout(None)?;
    let [relay, handover, log]: [OwnedFd; ADOPTION_FDS] = fds
        .try_into()
        .map_err(|_| std::io::Error::other("wrong number of sockets"))?;
    // What it logs from now on is the new supervisor's to read.
    crate::process::redirect_log(&log)?;
    drop(log);
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    seam.adopt(
        stream,
        msg::Hello {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uid,
            protocol: crate::seam::PROTOCOL,
            adoption: Some(msg::Adoption {
                secret: ticket.secret.clone(),
                serial: ticket.serial,
            }),
            answers_pings: true,
        },
    )?;
    let _ = arrivals.send(Arrival::Relay(UnixStream::from(relay)));
    incoming::handed_over(handover, arrivals.clone())
}
