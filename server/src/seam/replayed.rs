//! A connection whose first bytes were already read (by the supervisor, to
//! learn where it goes): reads give those bytes back first, then the socket's.
//! Writes go straight to the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

pub struct Replayed<S> {
    read_ahead: Vec<u8>,
    offset: usize,
    inner: S,
}

impl<S> Replayed<S> {
    pub fn new(read_ahead: Vec<u8>, inner: S) -> Replayed<S> {
        Replayed {
            read_ahead,
            offset: 0,
            inner,
        }
    }
}

impl<S: Connected> Connected for Replayed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.offset < this.read_ahead.len() {
            let left = &this.read_ahead[this.offset..];
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.offset += n;
            if this.offset == this.read_ahead.len() {
                this.read_ahead = Vec::new();
                this.offset = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn read_ahead_comes_first_then_the_socket() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut replayed = Replayed::new(b"hello ".to_vec(), server);
        client.write_all(b"world").await.unwrap();
        drop(client);
        let mut all = String::new();
        replayed.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }
}
