//! Lets any gRPC client reach the plugin, whatever `:authority` it sends.
//!
//! The HTTP/2 layer under tonic (h2) resets every request whose `:authority`
//! is no valid URI authority, and grpc-c clients (grpc-python, grpc-c++)
//! dialling `unix:///path/x.sock` send the socket's path, percent-encoded
//! (`var%2Flib%2F...`). The kubelet sends `localhost`, but whoever probes the
//! plugin from Python would get an opaque RST_STREAM. So each connection is
//! relayed: the client's header blocks are decoded, an `:authority` h2 would
//! refuse becomes `localhost`, and the block is encoded again; every other
//! frame, and everything the server sends back, passes through untouched.
//!
//! Encoded again, every header is a literal that is never indexed, so the
//! server's HPACK table stays empty and cannot disagree with the client's
//! (which only our decoder follows).

use loona_hpack::decoder::DecoderError;
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;
/// The frame size every HTTP/2 peer must accept (SETTINGS_MAX_FRAME_SIZE's
/// least value): frames written here never exceed it.
const SAFE_FRAME_LEN: usize = 16_384;
/// The HPACK table size h2 allows a client (SETTINGS_HEADER_TABLE_SIZE's
/// default, which tonic keeps): bounds what a client can make us hold.
const HPACK_TABLE_LEN: usize = 4096;
/// A header block (HEADERS and its CONTINUATIONs) beyond this closes the
/// connection: the plugin's requests carry a few hundred bytes of headers.
const MAX_HEADER_BLOCK_LEN: usize = 1 << 20;
/// What the kubelet sends, and what an `:authority` h2 would refuse becomes.
const STAND_IN_AUTHORITY: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no HTTP/2 connection preface")]
    NoPreface,
    #[error("malformed HTTP/2 frame: {0}")]
    Malformed(&'static str),
    #[error("malformed header block: {0}")]
    Hpack(#[from] DecoderError),
    #[error("a header block over {MAX_HEADER_BLOCK_LEN} bytes")]
    HeaderBlockTooLarge,
}

/// Relays one client connection to the plugin's server end.
pub async fn relay(client: UnixStream, server: UnixStream) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    // `requests` owns the server's write half: when the client is done, its
    // drop tells the server so, and the replies still drain below.
    let requests = requests(client_read, server_write);
    let replies = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::pin!(replies);
    tokio::select! {
        result = requests => match result {
            Ok(()) => {
                let _ = (&mut replies).await;
            }
            Err(err) => tracing::debug!("closing a connection to the plugin: {err}"),
        },
        _ = &mut replies => {}
    }
}

/// Copies the client's side of an HTTP/2 connection, header blocks re-encoded
/// by `rewrite_block`. Ends when the client closes between frames.
async fn requests<R, W>(mut from: R, mut to: W) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(RelayError::NoPreface);
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(HPACK_TABLE_LEN);
    while let Some(frame) = read_frame(&mut from).await? {
        if frame.kind != HEADERS {
            to.write_all(&frame.header).await?;
            to.write_all(&frame.payload).await?;
            continue;
        }
        let (priority, fragment) = headers_fragment(frame.flags, &frame.payload)?;
        let mut block = fragment.to_vec();
        let mut ended = frame.flags & END_HEADERS != 0;
        while !ended {
            let next = read_frame(&mut from).await?.ok_or(RelayError::Malformed(
                "the connection ended inside a header block",
            ))?;
            if next.kind != CONTINUATION || next.stream != frame.stream {
                return Err(RelayError::Malformed(
                    "a header block continued by another frame",
                ));
            }
            if block.len() + next.payload.len() > MAX_HEADER_BLOCK_LEN {
                return Err(RelayError::HeaderBlockTooLarge);
            }
            block.extend_from_slice(&next.payload);
            ended = next.flags & END_HEADERS != 0;
        }
        let rewritten = rewrite_block(&mut decoder, &block)?;
        let end_stream = frame.flags & END_STREAM != 0;
        to.write_all(&header_frames(
            frame.stream,
            end_stream,
            priority,
            &rewritten,
        ))
        .await?;
    }
    to.flush().await?;
    Ok(())
}

struct Frame {
    /// The 9 bytes as read, written again as they are.
    header: [u8; FRAME_HEADER_LEN],
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The next frame; None when the client closed between frames.
async fn read_frame<R: AsyncRead + Unpin>(from: &mut R) -> Result<Option<Frame>, RelayError> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    // The first byte alone tells a clean end from one inside a frame.
    if from.read(&mut header[..1]).await? == 0 {
        return Ok(None);
    }
    from.read_exact(&mut header[1..]).await?;
    // A 24-bit length: at most 16 MiB, what HTTP/2 itself bounds a frame to.
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        header,
        kind: header[3],
        flags: header[4],
        stream,
        payload,
    }))
}

/// A HEADERS frame's priority fields (if any) and its header block fragment,
/// padding dropped.
fn headers_fragment(flags: u8, payload: &[u8]) -> Result<(Option<&[u8]>, &[u8]), RelayError> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&len, after) = rest.split_first().ok_or(RelayError::Malformed(
            "a padded HEADERS frame without its pad length",
        ))?;
        padding = len as usize;
        rest = after;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        if rest.len() < PRIORITY_LEN {
            return Err(RelayError::Malformed(
                "a HEADERS frame shorter than its priority",
            ));
        }
        let (fields, after) = rest.split_at(PRIORITY_LEN);
        priority = Some(fields);
        rest = after;
    }
    if padding > rest.len() {
        return Err(RelayError::Malformed(
            "a HEADERS frame shorter than its padding",
        ));
    }
    Ok((priority, &rest[..rest.len() - padding]))
}

/// Whether h2 takes `value` as an `:authority` (it resets the stream if not).
fn valid_authority(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

/// Decodes a header block (following the client's HPACK table) and encodes
/// it again without indexing, an `:authority` h2 would refuse replaced.
fn rewrite_block(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<u8>, RelayError> {
    let mut out = Vec::with_capacity(block.len() + 16);
    decoder.decode_with_cb(block, |name, value| {
        let value: &[u8] = if &*name == b":authority" && !valid_authority(&value) {
            STAND_IN_AUTHORITY
        } else {
            &value
        };
        // Literal header field never indexed, new name (RFC 7541 §6.2.3):
        // leaves the server's table alone.
        out.push(0x10);
        put_string(&mut out, &name);
        put_string(&mut out, value);
    })?;
    Ok(out)
}

/// An HPACK string literal, not Huffman-coded: its length as an integer with
/// a 7-bit prefix (RFC 7541 §5.1), then the bytes.
fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    const PREFIX_MAX: usize = 127;
    let mut len = bytes.len();
    if len < PREFIX_MAX {
        out.push(len as u8);
    } else {
        out.push(PREFIX_MAX as u8);
        len -= PREFIX_MAX;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(bytes);
}

/// A header block as a HEADERS frame and as many CONTINUATIONs as it takes,
/// none over `SAFE_FRAME_LEN`.
fn header_frames(stream: u32, end_stream: bool, priority: Option<&[u8]>, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 2 * FRAME_HEADER_LEN + PRIORITY_LEN);
    let first_room = SAFE_FRAME_LEN - priority.map_or(0, <[u8]>::len);
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let mut flags = 0;
    if end_stream {
        flags |= END_STREAM;
    }
    if priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let mut payload = priority.unwrap_or_default().to_vec();
    payload.extend_from_slice(first);
    put_frame(&mut out, HEADERS, flags, stream, &payload);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(SAFE_FRAME_LEN));
        rest = after;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        put_frame(&mut out, CONTINUATION, flags, stream, chunk);
    }
    out
}

fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = (payload.len() as u32).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// What the server's decoder makes of blocks the client encoded as a
    /// grpc-c client does (indexing, so later blocks refer to the table).
    fn through_relay(blocks: &[Headers]) -> Vec<Headers> {
        let mut client = loona_hpack::Encoder::new();
        let mut relay = Decoder::new();
        let mut server = Decoder::new();
        blocks
            .iter()
            .map(|block| {
                let encoded = client.encode(block.iter().map(|(n, v)| (&n[..], &v[..])));
                let rewritten = rewrite_block(&mut relay, &encoded).unwrap();
                server.decode(&rewritten).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_a_valid_one_stays() {
        let grpc_python = headers(&[
            (":path", "/v1beta1.DevicePlugin/GetDevicePluginOptions"),
            (
                ":authority",
                "var%2Flib%2Fkubelet%2Fdevice-plugins%2Fsalus.sock",
            ),
            ("content-type", "application/grpc"),
        ]);
        let kubelet = headers(&[(":authority", "localhost:1234"), ("te", "trailers")]);
        let empty = headers(&[(":authority", "")]);
        let seen = through_relay(&[
            grpc_python.clone(),
            grpc_python.clone(),
            kubelet.clone(),
            empty,
        ]);
        let mut want = grpc_python;
        want[1].1 = b"localhost".to_vec();
        // The second block refers to the client's table: decoded the same.
        assert_eq!(seen[0], want);
        assert_eq!(seen[1], want);
        assert_eq!(seen[2], kubelet);
        assert_eq!(seen[3], headers(&[(":authority", "localhost")]));
    }

    #[test]
    fn long_values_keep_their_length_encoding() {
        for len in [126, 127, 128, 255, 16_383, 70_000] {
            let value = "x".repeat(len);
            let block = headers(&[("x-long", &value)]);
            assert_eq!(
                through_relay(std::slice::from_ref(&block))[0],
                block,
                "length {len}"
            );
        }
    }

    #[test]
    fn big_blocks_are_split_into_continuations_within_the_safe_frame_size() {
        let block = vec![7u8; 2 * SAFE_FRAME_LEN + 10];
        let priority = [0, 0, 0, 3, 16];
        let frames = header_frames(5, true, Some(&priority), &block);
        let mut at = 0;
        let mut kinds = Vec::new();
        let mut fragment = Vec::new();
        while at < frames.len() {
            let len = u32::from_be_bytes([0, frames[at], frames[at + 1], frames[at + 2]]) as usize;
            assert!(len <= SAFE_FRAME_LEN);
            kinds.push((frames[at + 3], frames[at + 4]));
            let payload = &frames[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len];
            let (prio, frag) = if frames[at + 3] == HEADERS {
                headers_fragment(frames[at + 4], payload).unwrap()
            } else {
                (None, payload)
            };
            if let Some(p) = prio {
                assert_eq!(p, priority);
            }
            fragment.extend_from_slice(frag);
            at += FRAME_HEADER_LEN + len;
        }
        assert_eq!(fragment, block);
        assert_eq!(
            kinds,
            [
                (HEADERS, END_STREAM | PRIORITY),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
    }

    #[test]
    fn padding_and_priority_are_taken_off_the_fragment() {
        let payload = [2, 0, 0, 0, 1, 9, 0xaa, 0xbb, 0, 0];
        let (priority, fragment) = headers_fragment(PADDED | PRIORITY, &payload).unwrap();
        assert_eq!(priority, Some(&payload[1..6]));
        assert_eq!(fragment, [0xaa, 0xbb]);
        assert!(headers_fragment(PADDED, &[5, 1]).is_err());
        assert!(headers_fragment(PRIORITY, &[0, 0]).is_err());
        assert!(headers_fragment(PADDED, &[]).is_err());
    }

    #[test]
    fn garbage_header_blocks_are_errors_not_panics() {
        // A small xorshift: the same inputs on every run.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let block: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = rewrite_block(&mut Decoder::new(), &block);
        }
    }

    #[tokio::test]
    async fn a_connection_is_relayed_frame_by_frame() {
        let mut client = loona_hpack::Encoder::new();
        let block = client.encode([(&b":authority"[..], &b"tmp%2Fx.sock"[..])]);
        let mut input = PREFACE.to_vec();
        put_frame(&mut input, 0x4, 0, 0, &[]); // SETTINGS passes untouched
        put_frame(&mut input, HEADERS, 0, 1, &block[..1]);
        put_frame(&mut input, CONTINUATION, END_HEADERS, 1, &block[1..]);
        let mut output = Vec::new();
        requests(&input[..], &mut output).await.unwrap();
        assert_eq!(
            &output[..PREFACE.len() + FRAME_HEADER_LEN],
            &input[..PREFACE.len() + FRAME_HEADER_LEN]
        );
        let headers = &output[PREFACE.len() + FRAME_HEADER_LEN..];
        assert_eq!((headers[3], headers[4]), (HEADERS, END_HEADERS));
        let decoded = Decoder::new().decode(&headers[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!(
            decoded,
            vec![(b":authority".to_vec(), b"localhost".to_vec())]
        );
        // A block cut off by the end of the connection is an error.
        let cut = &input[..input.len() - 2];
        assert!(requests(cut, &mut Vec::new()).await.is_err());
    }
}
