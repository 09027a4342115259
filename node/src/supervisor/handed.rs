//! The supervisor's copies of the client connections it handed to an
//! executor, so that it can answer for an executor that died.
//!
//! When an executor dies, the kernel would close every connection it held,
//! and TensorFlow's clients would see only "Socket closed" (TF2's eager client
//! does not retry it). The supervisor keeps a duplicate of each handed-over
//! socket: the connection outlives the executor, and the supervisor ends it
//! with an HTTP/2 GOAWAY whose debug text says what happened (last stream 0:
//! no call was processed, so the client may retry its unanswered calls on a
//! new connection, where the tenant's next executor answers them with the same
//! cause), then shuts it down.
//!
//! A duplicate would also keep open a connection the executor is done with,
//! so the executor shuts each handed-over socket down when it drops it
//! (`executor::incoming`), and copies whose socket is shut down or closed by
//! the client are dropped here (at each hand-over and every few seconds).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use crate::http2::{goaway_frame, INTERNAL_ERROR};
use crate::tenant::connections::ConnectionPermit;

#[derive(Default)]
pub struct HandedConnections {
    sockets: Mutex<Vec<Kept>>,
}

/// A copy of a handed-over connection, and the connection's place among its
/// owner's (`--max-tenant-connections`), given back with the copy.
struct Kept {
    socket: OwnedFd,
    _permit: Option<ConnectionPermit>,
}

impl HandedConnections {
    /// Keeps a copy of a connection being handed over, and its permit
    /// (dropping the copies of connections that ended meanwhile).
    pub fn keep(&self, copy: OwnedFd, permit: Option<ConnectionPermit>) {
        let mut sockets = self.pruned();
        sockets.push(Kept {
            socket: copy,
            _permit: permit,
        });
    }

    /// Drops the copies of connections that ended.
    pub fn prune(&self) {
        drop(self.pruned());
    }

    fn pruned(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        let mut sockets = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        sockets.retain(|kept| !is_finished(&kept.socket));
        sockets
    }

    /// How many copies are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Ends every kept connection: with a GOAWAY carrying `failure` when the
    /// executor failed, then a shutdown, so the client sees the end.
    pub fn end_all(&self, failure: Option<&str>) {
        let sockets = std::mem::take(&mut *self.sockets.lock().unwrap_or_else(|e| e.into_inner()));
        for Kept { socket, .. } in sockets {
            if is_finished(&socket) {
                continue;
            }
            if let Some(why) = failure {
                let frame = goaway_frame(INTERNAL_ERROR, why);
                // SAFETY: a plain write of an owned buffer to an owned socket;
                // MSG_DONTWAIT: a client that reads nothing does not stall the reaper.
                unsafe {
                    libc::send(
                        socket.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    );
                }
            }
            // SAFETY: shutting down an owned socket.
            unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }
}

/// Whether a connection has ended: shut down by the executor (reads return
/// end of file at once) or by the client, or broken.
fn is_finished(socket: &OwnedFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a non-blocking peek of one byte into a local.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n > 0 {
        return false;
    }
    n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::connections::{ConnectionCounts, Owner};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_failed_executors_connections_get_the_cause_then_end() {
        // TCP with a request the dead executor never read: closing the socket
        // resets the connection, and the client still reads the GOAWAY first.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (&client).write_all(&[7u8; 100_000]).unwrap();
        let handed = HandedConnections::default();
        handed.keep(OwnedFd::from(server), None);
        assert_eq!(handed.len(), 1);
        handed.end_all(Some("killed by signal 9 (SIGKILL)"));
        let mut got = Vec::new();
        (&client).read_to_end(&mut got).unwrap();
        assert_eq!(
            got,
            goaway_frame(INTERNAL_ERROR, "killed by signal 9 (SIGKILL)")
        );
        assert_eq!(handed.len(), 0);
    }

    #[test]
    fn finished_connections_are_dropped_and_live_ones_kept() {
        let (client_a, server_a) = UnixStream::pair().unwrap();
        let (client_b, server_b) = UnixStream::pair().unwrap();
        let handed = HandedConnections::default();
        // Unread bytes: still live (the executor has yet to read them).
        (&client_a).write_all(b"request").unwrap();
        let counts = ConnectionCounts::new(0);
        let owner = Owner::Uid(1000);
        let permit = || Some(counts.admit(owner.clone()).unwrap());
        handed.keep(server_a.try_clone().unwrap().into(), permit());
        // The executor shut b down.
        handed.keep(server_b.try_clone().unwrap().into(), permit());
        server_b.shutdown(std::net::Shutdown::Both).unwrap();
        let (_c, spare) = UnixStream::pair().unwrap();
        handed.keep(OwnedFd::from(spare), permit());
        assert_eq!(handed.len(), 2, "b was dropped, a and the spare kept");
        assert_eq!(
            counts.open(&owner),
            2,
            "b's place was given back with its copy"
        );
        // A clean stop ends them without a frame.
        handed.end_all(None);
        assert_eq!(counts.open(&owner), 0);
        let mut got = Vec::new();
        (&client_b).read_to_end(&mut got).unwrap();
        assert!(got.is_empty());
        drop(client_a);
    }
}
