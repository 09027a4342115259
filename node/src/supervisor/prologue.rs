//! The start of a client's HTTP/2 connection, read by the supervisor to learn
//! where the connection goes before anyone serves it: the path and
//! `user-agent` of its first request.
//!
//! TensorFlow's gRPC client sends its first request only after the server's
//! SETTINGS, so the supervisor sends an empty SETTINGS frame (every value at
//! HTTP/2's default, which whoever serves the connection next may raise) and
//! reads until the first request's headers are complete. What it read is then
//! given, as read, to the server that takes the connection, less what only
//! concerned the supervisor: the client's acknowledgement of those SETTINGS
//! if it came already (if not, `seam::replayed` drops it when it comes) and
//! PINGs it answered itself. That server sends its own SETTINGS, which the
//! client acknowledges to it.

use std::fmt;

use crate::http2::PREFACE;

const FRAME_HEADER: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE's default: the largest frame a client may send
/// before the server raises it.
const MAX_FRAME: usize = 16_384;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;

const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The first request as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstRequest {
    pub path: String,
    pub user_agent: Option<String>,
}

/// What went wrong reading a prologue; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrologueError {
    NotHttp2,
    Protocol(&'static str),
    TooLarge,
    Closed,
}

impl fmt::Display for PrologueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrologueError::NotHttp2 => write!(
                f,
                "the client does not speak HTTP/2 (no connection preface)"
            ),
            PrologueError::Protocol(what) => {
                write!(f, "HTTP/2 protocol error before the first request: {what}")
            }
            PrologueError::TooLarge => {
                write!(f, "the first request's headers are too large to route")
            }
            PrologueError::Closed => write!(
                f,
                "the client closed the connection before its first request"
            ),
        }
    }
}

/// What the reader should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Read more bytes and feed them.
    More,
    /// Write these bytes to the client (PING acknowledgements), then read more.
    Reply(Vec<u8>),
    /// The first request is known: write `reply` to the client (PING
    /// acknowledgements, maybe none), then hand the connection over with
    /// `read_ahead`, what the next server must read first, and whether the
    /// client acknowledged the supervisor's SETTINGS in it (taken out).
    Done {
        request: FirstRequest,
        reply: Vec<u8>,
        read_ahead: Vec<u8>,
        settings_acked: bool,
    },
}

/// Feeds on a connection's first bytes until its first request is known.
pub struct Prologue {
    /// Bytes received and not yet parsed into frames.
    pending: Vec<u8>,
    /// What the next server will read first.
    read_ahead: Vec<u8>,
    limit: usize,
    preface_seen: bool,
    acked: bool,
    /// The first request's stream and its header block so far.
    block_stream: Option<u32>,
    block: Vec<u8>,
    block_done: bool,
    request: Option<FirstRequest>,
}

impl Prologue {
    /// `limit`: the most bytes kept for the next server.
    pub fn new(limit: usize) -> Prologue {
        Prologue {
            pending: Vec::new(),
            read_ahead: Vec::new(),
            limit,
            preface_seen: false,
            acked: false,
            block_stream: None,
            block: Vec::new(),
            block_done: false,
            request: None,
        }
    }

    /// Takes the bytes just read; an empty slice means the client closed.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Step, PrologueError> {
        if bytes.is_empty() {
            return Err(PrologueError::Closed);
        }
        self.pending.extend_from_slice(bytes);
        if self.pending.len() + self.read_ahead.len() > self.limit + MAX_FRAME + FRAME_HEADER {
            return Err(PrologueError::TooLarge);
        }
        if !self.preface_seen {
            let n = self.pending.len().min(PREFACE.len());
            if self.pending[..n] != PREFACE[..n] {
                return Err(PrologueError::NotHttp2);
            }
            if n < PREFACE.len() {
                return Ok(Step::More);
            }
            self.pending.drain(..PREFACE.len());
            self.read_ahead.extend_from_slice(PREFACE);
            self.preface_seen = true;
        }
        let mut reply = Vec::new();
        while self.pending.len() >= FRAME_HEADER {
            let h = &self.pending[..FRAME_HEADER];
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            if len > MAX_FRAME {
                return Err(PrologueError::Protocol(
                    "a frame larger than SETTINGS_MAX_FRAME_SIZE",
                ));
            }
            if self.pending.len() < FRAME_HEADER + len {
                break;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
            let payload = &frame[FRAME_HEADER..];
            let mut keep = true;
            match kind {
                SETTINGS if flags & ACK != 0 => {
                    if !self.acked {
                        // Acknowledges the supervisor's SETTINGS, which the next server never sent.
                        self.acked = true;
                        keep = false;
                    }
                }
                PING if flags & ACK == 0 => {
                    if payload.len() != 8 {
                        return Err(PrologueError::Protocol("a PING frame of the wrong size"));
                    }
                    reply.extend_from_slice(&[0, 0, 8, PING, ACK, 0, 0, 0, 0]);
                    reply.extend_from_slice(payload);
                    keep = false;
                }
                GOAWAY => return Err(PrologueError::Closed),
                HEADERS if self.block_stream.is_none() => {
                    if stream == 0 {
                        return Err(PrologueError::Protocol("HEADERS on stream 0"));
                    }
                    self.block_stream = Some(stream);
                    self.block
                        .extend_from_slice(header_fragment(flags, payload)?);
                    self.block_done = flags & END_HEADERS != 0;
                }
                CONTINUATION if self.block_stream == Some(stream) && !self.block_done => {
                    self.block.extend_from_slice(payload);
                    self.block_done = flags & END_HEADERS != 0;
                }
                CONTINUATION if self.block_stream.is_none() => {
                    return Err(PrologueError::Protocol("CONTINUATION without HEADERS"));
                }
                DATA if self.block_stream.is_none() => {
                    return Err(PrologueError::Protocol("DATA before any request"));
                }
                _ => {}
            }
            if keep {
                self.read_ahead.extend_from_slice(&frame);
            }
            if self.read_ahead.len() > self.limit {
                return Err(PrologueError::TooLarge);
            }
            if self.block_done && self.request.is_none() {
                self.request = Some(decode_request(&self.block)?);
            }
        }
        if let Some(request) = &self.request {
            let mut read_ahead = std::mem::take(&mut self.read_ahead);
            // Bytes of a frame not yet whole go along too, as read.
            read_ahead.append(&mut self.pending);
            if read_ahead.len() > self.limit {
                return Err(PrologueError::TooLarge);
            }
            return Ok(Step::Done {
                request: request.clone(),
                reply,
                read_ahead,
                settings_acked: self.acked,
            });
        }
        if reply.is_empty() {
            Ok(Step::More)
        } else {
            Ok(Step::Reply(reply))
        }
    }
}

/// A HEADERS payload less its padding and priority fields.
fn header_fragment(flags: u8, payload: &[u8]) -> Result<&[u8], PrologueError> {
    let mut fragment = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = fragment.split_first().ok_or(PrologueError::Protocol(
            "a padded HEADERS frame without its pad length",
        ))?;
        pad = usize::from(n);
        fragment = rest;
    }
    if flags & PRIORITY != 0 {
        fragment = fragment.get(5..).ok_or(PrologueError::Protocol(
            "a HEADERS frame too short for its priority",
        ))?;
    }
    if pad > fragment.len() {
        return Err(PrologueError::Protocol(
            "HEADERS padding longer than the frame",
        ));
    }
    Ok(&fragment[..fragment.len() - pad])
}

fn decode_request(block: &[u8]) -> Result<FirstRequest, PrologueError> {
    let mut decoder = loona_hpack::Decoder::new();
    let headers = decoder.decode(block).map_err(|_| {
        PrologueError::Protocol("the first request's headers do not decode (HPACK)")
    })?;
    let mut path = None;
    let mut user_agent = None;
    for (name, value) in headers {
        match name.as_slice() {
            b":path" => path = Some(String::from_utf8_lossy(&value).into_owned()),
            b"user-agent" => user_agent = Some(String::from_utf8_lossy(&value).into_owned()),
            _ => {}
        }
    }
    Ok(FirstRequest {
        path: path.ok_or(PrologueError::Protocol("the first request has no :path"))?,
        user_agent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn block(path: &str, user_agent: &str) -> Vec<u8> {
        let mut encoder = loona_hpack::Encoder::new();
        encoder.encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (&b":scheme"[..], &b"http"[..]),
            (&b":path"[..], path.as_bytes()),
            (&b"content-type"[..], &b"application/grpc"[..]),
            (&b"user-agent"[..], user_agent.as_bytes()),
        ])
    }

    const PATH: &str = "/tensorflow.MasterService/CreateSession";
    const AGENT: &str = "grpc-c++/1.74.0 salus1.abc grpc-c/49.0.0 (linux; chttp2)";

    fn client_settings() -> Vec<u8> {
        frame(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 0])
    }

    fn done(step: Step) -> (FirstRequest, Vec<u8>, Vec<u8>) {
        done_acked(step).0
    }

    fn done_acked(step: Step) -> ((FirstRequest, Vec<u8>, Vec<u8>), bool) {
        match step {
            Step::Done {
                request,
                reply,
                read_ahead,
                settings_acked,
            } => ((request, reply, read_ahead), settings_acked),
            other => panic!("not done: {other:?}"),
        }
    }

    #[test]
    fn finds_the_first_request_and_drops_the_acknowledgement() {
        let headers = frame(HEADERS, END_HEADERS, 1, &block(PATH, AGENT));
        let window = frame(8, 0, 0, &[0, 0, 0x10, 0]);
        let ack = frame(SETTINGS, ACK, 0, &[]);
        let bytes = [PREFACE, &client_settings(), &window, &ack, &headers].concat();
        let mut prologue = Prologue::new(1 << 16);
        let ((request, reply, read_ahead), acked) = done_acked(prologue.feed(&bytes).unwrap());
        assert!(acked);
        assert_eq!(request.path, PATH);
        assert_eq!(request.user_agent.as_deref(), Some(AGENT));
        assert!(reply.is_empty());
        assert_eq!(
            read_ahead,
            [PREFACE, &client_settings(), &window, &headers].concat()
        );
    }

    #[test]
    fn byte_by_byte_input_and_no_acknowledgement_yet() {
        let headers = frame(HEADERS, END_HEADERS, 1, &block(PATH, AGENT));
        let bytes = [PREFACE, &client_settings(), &headers[..headers.len() - 1]].concat();
        let mut prologue = Prologue::new(1 << 16);
        for b in &bytes {
            assert_eq!(prologue.feed(std::slice::from_ref(b)).unwrap(), Step::More);
        }
        // The last byte of the headers and part of the next frame: that part goes along as read.
        let data = frame(DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
        let more = [&headers[headers.len() - 1..], &data[..3]].concat();
        let ((request, _, read_ahead), acked) = done_acked(prologue.feed(&more).unwrap());
        assert_eq!(request.path, PATH);
        assert!(!acked, "the client has not acknowledged the SETTINGS yet");
        assert_eq!(
            read_ahead,
            [PREFACE, &client_settings(), &headers, &data[..3]].concat()
        );
    }

    #[test]
    fn padded_prioritised_headers_with_continuations() {
        let block = block(PATH, AGENT);
        let (first, rest) = block.split_at(5);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(first);
        payload.extend_from_slice(&[0, 0, 0]);
        let headers = frame(HEADERS, PADDED | PRIORITY, 3, &payload);
        let (a, b) = rest.split_at(rest.len() / 2);
        let c1 = frame(CONTINUATION, 0, 3, a);
        let c2 = frame(CONTINUATION, END_HEADERS, 3, b);
        let ack = frame(SETTINGS, ACK, 0, &[]);
        let bytes = [PREFACE, &ack, &headers, &c1, &c2].concat();
        let (request, _, _) = done(Prologue::new(1 << 16).feed(&bytes).unwrap());
        assert_eq!(request.path, PATH);
    }

    #[test]
    fn pings_are_answered_here_and_not_passed_on() {
        let ping = frame(PING, 0, 0, b"12345678");
        let mut prologue = Prologue::new(1 << 16);
        let step = prologue.feed(&[PREFACE, &ping].concat()).unwrap();
        assert_eq!(step, Step::Reply(frame(PING, ACK, 0, b"12345678")));
        let headers = frame(HEADERS, END_HEADERS, 1, &block(PATH, AGENT));
        let ack = frame(SETTINGS, ACK, 0, &[]);
        let (_, reply, read_ahead) = done(
            prologue
                .feed(&[&ack[..], &ping, &headers].concat())
                .unwrap(),
        );
        assert_eq!(reply, frame(PING, ACK, 0, b"12345678"));
        assert_eq!(read_ahead, [PREFACE, &headers].concat());
    }

    #[test]
    fn refuses_what_is_not_an_http2_client_or_too_large() {
        assert_eq!(
            Prologue::new(1 << 16).feed(b"GET / HTTP/1.1\r\n"),
            Err(PrologueError::NotHttp2)
        );
        assert_eq!(Prologue::new(1 << 16).feed(b""), Err(PrologueError::Closed));
        let big = frame(HEADERS, 0, 1, &vec![0u8; 16_000]);
        let mut prologue = Prologue::new(20_000);
        prologue.feed(PREFACE).unwrap();
        assert_eq!(prologue.feed(&big).unwrap(), Step::More);
        assert_eq!(
            prologue.feed(&frame(CONTINUATION, 0, 1, &vec![0u8; 16_000])),
            Err(PrologueError::TooLarge)
        );
        let oversized = [PREFACE, &[0x01, 0, 0, HEADERS, 0, 0, 0, 0, 1][..]].concat();
        assert!(matches!(
            Prologue::new(1 << 16).feed(&oversized),
            Err(PrologueError::Protocol(_))
        ));
        let bad_block = [
            PREFACE,
            &frame(
                HEADERS,
                END_HEADERS,
                1,
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            ),
        ]
        .concat();
        assert!(matches!(
            Prologue::new(1 << 16).feed(&bad_block),
            Err(PrologueError::Protocol(_))
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small xorshift generator: the same inputs on every machine.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = [
            PREFACE,
            &frame(HEADERS, END_HEADERS, 1, &block(PATH, AGENT)),
        ]
        .concat();
        for _ in 0..2000 {
            let mut bytes = valid.clone();
            for _ in 0..(next() % 8) {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            let cut = (next() as usize) % (bytes.len() + 1);
            let mut prologue = Prologue::new(1 << 16);
            let _ = prologue.feed(&bytes[..cut]);
            let _ = prologue.feed(&bytes[cut..]);
        }
    }
}
