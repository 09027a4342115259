//! The connections an executor serves: the supervisor's relay connection (fd
//! 3), and client connections the supervisor handed over (fd 5), each with
//! the bytes the supervisor read from it first.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::seam::handover::Handed;
use crate::seam::replayed::Replayed;

/// One connection an executor serves.
pub enum Conn {
    Relay(UnixStream),
    Client(Replayed<TcpStream>),
}

impl Connected for Conn {
    // Every request is the executor's tenant's: nothing to know of the peer.
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// A connection for the executor to serve, as it arrives from a supervisor.
pub enum Arrival {
    /// A supervisor's relay connection (one per supervisor: a new one comes
    /// with each adoption).
    Relay(std::os::unix::net::UnixStream),
    Handed(Handed),
}

/// Receives handed-over connections on `channel` (a thread of its own: the
/// reads block) until the supervisor's end closes.
pub fn handed_over(channel: OwnedFd, to: mpsc::UnboundedSender<Arrival>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("salus-handover".into())
        .spawn(move || loop {
            match crate::seam::handover::recv(&channel) {
                Ok(Some(conn)) => {
                    if to.send(Arrival::Handed(conn)).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    tracing::error!(cause = %err, "receiving a connection from the supervisor failed");
                    break;
                }
            }
        })?;
    Ok(())
}

/// Every connection as it arrives (never ends: a supervisor that adopts this
/// executor brings new ones).
pub fn connections(
    arrivals: mpsc::UnboundedReceiver<Arrival>,
) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
    UnboundedReceiverStream::new(arrivals).map(|arrival| match arrival {
        Arrival::Relay(relay) => {
            relay.set_nonblocking(true)?;
            Ok(Conn::Relay(UnixStream::from_std(relay)?))
        }
        Arrival::Handed(handed) => {
            let std = std::net::TcpStream::from(handed.conn);
            std.set_nonblocking(true)?;
            let _ = std.set_nodelay(true);
            Ok(Conn::Client(Replayed::new(
                handed.read_ahead,
                TcpStream::from_std(std)?,
                handed.settings_acked,
            )))
        }
    })
}

/// The supervisor keeps a copy of each handed-over socket (to end it if this
/// process dies: `supervisor::handed`), so closing ours alone would leave the
/// connection open: shut it down, which ends it for every copy.
impl Drop for Conn {
    fn drop(&mut self) {
        if let Conn::Client(conn) = self {
            // SAFETY: shutting down a socket this value owns; it is closed right after.
            unsafe { libc::shutdown(conn.get_ref().as_raw_fd(), libc::SHUT_RDWR) };
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Relay(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Client(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Relay(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Client(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Relay(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Client(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Relay(s) => s.is_write_vectored(),
            Conn::Client(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Relay(s) => Pin::new(s).poll_flush(cx),
            Conn::Client(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Relay(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Client(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
