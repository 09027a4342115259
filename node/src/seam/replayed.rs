//! A client connection whose first bytes were already read (by the supervisor,
//! to learn where it goes): reads give those bytes back first, then the
//! socket's, so the server that takes the connection starts at its preface.
//! Writes go straight to the socket.
//!
//! The supervisor sent one SETTINGS frame of its own before the handover. A
//! client acknowledges it, but not always before its first request (TF 2.16's
//! client, measured: its acknowledgement came after the request's frames). The
//! next server never sent those settings, and an acknowledgement it did not
//! ask for is a protocol error to it; so until the client's first SETTINGS
//! acknowledgement has gone by, reads follow the frames and drop that one.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::http2::PREFACE;

pub struct Replayed<S> {
    inner: S,
    /// Bytes ready for the reader, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    /// Set while the supervisor's SETTINGS is unacknowledged.
    scan: Option<AckScan>,
}

impl<S> Replayed<S> {
    /// `read_ahead` starts at the connection's preface and holds whole bytes
    /// as read; `settings_acked`: whether the supervisor already saw (and took
    /// out of `read_ahead`) the client's acknowledgement of its SETTINGS.
    pub fn new(read_ahead: Vec<u8>, inner: S, settings_acked: bool) -> Replayed<S> {
        let mut replayed = Replayed {
            inner,
            ready: Vec::new(),
            ready_at: 0,
            scan: (!settings_acked).then(AckScan::default),
        };
        replayed.take_in(&read_ahead);
        replayed
    }

    /// The connection underneath.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn take_in(&mut self, bytes: &[u8]) {
        let rest = match &mut self.scan {
            None => bytes,
            Some(scan) => {
                let rest = scan.filter(bytes, &mut self.ready);
                if !scan.done {
                    return;
                }
                self.scan = None;
                rest
            }
        };
        self.ready.extend_from_slice(rest);
    }
}

/// Follows frames from the preface on until the first SETTINGS acknowledgement.
#[derive(Default)]
struct AckScan {
    /// Bytes of the preface or of the current frame's payload still to pass.
    passing: usize,
    preface_passed: bool,
    header: Vec<u8>,
    done: bool,
}

const SETTINGS: u8 = 4;
const ACK: u8 = 0x1;

impl AckScan {
    /// Moves `bytes` to `out`, less the acknowledgement; once it is dropped,
    /// returns what follows it, unscanned.
    fn filter<'a>(&mut self, mut bytes: &'a [u8], out: &mut Vec<u8>) -> &'a [u8] {
        if !self.preface_passed {
            self.passing = PREFACE.len();
            self.preface_passed = true;
        }
        while !bytes.is_empty() {
            if self.passing > 0 {
                let n = self.passing.min(bytes.len());
                out.extend_from_slice(&bytes[..n]);
                self.passing -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < 9 {
                break;
            }
            let h = std::mem::take(&mut self.header);
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            if h[3] == SETTINGS && h[4] & ACK != 0 && len == 0 {
                self.done = true;
                return bytes;
            }
            out.extend_from_slice(&h);
            self.passing = len;
        }
        &[]
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
        loop {
            if this.ready_at < this.ready.len() {
                let left = &this.ready[this.ready_at..];
                let n = left.len().min(buf.remaining());
                buf.put_slice(&left[..n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.scan.is_none() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // End of stream: a header cut short goes out as it came.
                if let Some(scan) = this.scan.take() {
                    if !scan.header.is_empty() {
                        this.ready.extend_from_slice(&scan.header);
                        continue;
                    }
                }
                return Poll::Ready(Ok(()));
            }
            let filled = read.filled().to_vec();
            this.take_in(&filled);
        }
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

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    async fn read_all(replayed: Replayed<tokio::io::DuplexStream>) -> Vec<u8> {
        let mut replayed = replayed;
        let mut all = Vec::new();
        replayed.read_to_end(&mut all).await.unwrap();
        all
    }

    #[tokio::test]
    async fn read_ahead_comes_first_then_the_socket() {
        let (mut client, server) = tokio::io::duplex(64);
        let replayed = Replayed::new(b"hello ".to_vec(), server, true);
        client.write_all(b"world").await.unwrap();
        drop(client);
        assert_eq!(read_all(replayed).await, b"hello world");
    }

    #[tokio::test]
    async fn a_late_acknowledgement_is_dropped_wherever_it_is_cut() {
        let headers = frame(1, 4, &[0x82; 40]);
        // A SETTINGS ACK's bytes inside a DATA payload are data, not an acknowledgement.
        let data = frame(0, 0, &[0, 0, 0, 4, 1, 0, 0, 0, 0]);
        let ack = frame(SETTINGS, ACK, &[]);
        let ping = frame(6, 0, b"12345678");
        let read_ahead = [PREFACE, &headers[..20]].concat();
        let later = [&headers[20..], &data, &ack, &ping, &ack].concat();
        let expected = [PREFACE, &headers, &data, &ping, &ack].concat();
        for cut in 0..later.len() {
            let (mut client, server) = tokio::io::duplex(4096);
            let replayed = Replayed::new(read_ahead.clone(), server, false);
            client.write_all(&later[..cut]).await.unwrap();
            client.flush().await.unwrap();
            let rest = later[cut..].to_vec();
            let writer = tokio::spawn(async move {
                tokio::task::yield_now().await;
                client.write_all(&rest).await.unwrap();
            });
            assert_eq!(read_all(replayed).await, expected, "cut at {cut}");
            writer.await.unwrap();
        }
    }

    #[tokio::test]
    async fn an_acknowledgement_already_seen_is_not_looked_for() {
        let ack = frame(SETTINGS, ACK, &[]);
        let (mut client, server) = tokio::io::duplex(4096);
        let replayed = Replayed::new(PREFACE.to_vec(), server, true);
        client.write_all(&ack).await.unwrap();
        drop(client);
        assert_eq!(read_all(replayed).await, [PREFACE, &ack].concat());
    }
}
