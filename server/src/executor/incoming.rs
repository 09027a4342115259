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

/// Receives handed-over connections on `channel` (a thread of its own: the
/// reads block) until the supervisor's end closes.
pub fn handed_over(channel: OwnedFd) -> io::Result<mpsc::UnboundedReceiver<Handed>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("salus-handover".into())
        .spawn(move || loop {
            match crate::seam::handover::recv(&channel) {
                Ok(Some(conn)) => {
                    if tx.send(conn).is_err() {
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
    Ok(rx)
}

/// The relay connection, then every handed-over connection as it comes.
pub fn connections(
    relay: UnixStream,
    handed: mpsc::UnboundedReceiver<Handed>,
) -> impl Stream<Item = io::Result<Conn>> + Send + 'static {
    let clients = UnboundedReceiverStream::new(handed).map(|handed| {
        let std = std::net::TcpStream::from(handed.conn);
        std.set_nonblocking(true)?;
        let _ = std.set_nodelay(true);
        Ok(Conn::Client(Replayed::new(
            handed.read_ahead,
            TcpStream::from_std(std)?,
            handed.settings_acked,
        )))
    });
    tokio_stream::once(Ok(Conn::Relay(relay)))
        .chain(tokio_stream::pending())
        .merge(clients)
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
