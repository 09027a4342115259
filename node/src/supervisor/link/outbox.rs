//! What the supervisor sends one executor, written by a thread of its own:
//! the senders (lane threads of the one scheduler core, the link's reader,
//! admission tasks) only queue a frame, so an executor that stops reading
//! wedges nobody but its own writer. The queue is bounded; a full one means
//! the executor has not read for thousands of messages, and the link ends it.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, SyncSender, TrySendError};

use crate::seam::frame::write_frame;
use crate::seam::msg;

/// Frames queued for one executor at most. Nothing the supervisor sends
/// unasked (only Pings, one at a time) can fill it: an executor reaches it
/// only by sending thousands of requests and reading none of the answers.
pub const OUTBOX_CAPACITY: usize = 4096;

pub struct Outbox {
    queue: SyncSender<msg::ToExecutor>,
}

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum NotSent {
    /// The executor did not read for [`OUTBOX_CAPACITY`] frames.
    Full,
    /// The writer stopped: the seam is gone.
    Closed,
}

impl Outbox {
    /// Starts the writer thread on `stream`. A failed write shuts the socket
    /// down, so the link's reader sees the end and the link dies.
    pub fn start(stream: UnixStream, label: &str) -> io::Result<Outbox> {
        Self::with_capacity(stream, label, OUTBOX_CAPACITY)
    }

    pub fn with_capacity(
        mut stream: UnixStream,
        label: &str,
        capacity: usize,
    ) -> io::Result<Outbox> {
        let (queue, frames) = mpsc::sync_channel::<msg::ToExecutor>(capacity);
        std::thread::Builder::new()
            .name(format!("salus-seamw-{label}"))
            .spawn(move || {
                for frame in frames {
                    if write_frame(&mut stream, &frame).is_err() {
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                }
            })?;
        Ok(Outbox { queue })
    }

    pub fn send(&self, message: msg::to_executor::Msg) -> Result<(), NotSent> {
        let frame = msg::ToExecutor { msg: Some(message) };
        self.queue.try_send(frame).map_err(|err| match err {
            TrySendError::Full(_) => NotSent::Full,
            TrySendError::Disconnected(_) => NotSent::Closed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::frame::read_frame;
    use crate::seam::msg::to_executor;

    fn ping(id: u64) -> to_executor::Msg {
        to_executor::Msg::Ping(msg::Ping { id })
    }

    #[test]
    fn a_reader_that_stops_fills_the_queue_and_blocks_no_sender() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let outbox = Outbox::with_capacity(ours, "test", 8).unwrap();
        outbox.send(ping(1)).unwrap();
        assert_eq!(
            read_frame::<_, msg::ToExecutor>(&mut theirs)
                .unwrap()
                .and_then(|m| m.msg),
            Some(ping(1))
        );
        // Nobody reads now: the socket's buffer fills, then the queue; every
        // send returns at once.
        let mut sent = 0u64;
        let full = loop {
            match outbox.send(ping(sent)) {
                Ok(()) => sent += 1,
                Err(err) => break err,
            }
            assert!(sent < 10_000_000, "the queue never filled");
        };
        assert_eq!(full, NotSent::Full);
        drop(theirs);
        // The writer fails on the closed socket and stops: Closed, not a hang.
        let closed = loop {
            match outbox.send(ping(0)) {
                Err(NotSent::Closed) => break true,
                _ => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        };
        assert!(closed);
    }
}
