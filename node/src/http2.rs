//! HTTP/2 as the supervisor and the servers speak it below gRPC: the bytes the
//! supervisor reads or writes itself before (or instead of) handing a
//! connection over, and the flow-control windows every server uses. A leaf:
//! it imports nothing of the crate.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: the supervisor's only frame before the handover.
pub const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// HTTP/2 flow-control windows of the gRPC servers and of the supervisor's
/// connections to executors (one connection carries all of a tenant's calls).
pub const H2_STREAM_WINDOW: u32 = 16 << 20;
pub const H2_CONNECTION_WINDOW: u32 = 64 << 20;

/// HTTP/2 frame type GOAWAY and error codes INTERNAL_ERROR and
/// ENHANCE_YOUR_CALM (RFC 9113 §6.8, §7).
const GOAWAY: u8 = 0x7;
pub const INTERNAL_ERROR: u32 = 0x2;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;
/// Debug text is cut to this many bytes (the frame must fit the client's
/// smallest allowed frame size, 16 KiB).
const MAX_DEBUG_BYTES: usize = 4096;

/// A GOAWAY frame: last stream 0, error `code`, `why` as debug data.
pub fn goaway_frame(code: u32, why: &str) -> Vec<u8> {
    let mut debug = why.as_bytes();
    if debug.len() > MAX_DEBUG_BYTES {
        debug = &debug[..MAX_DEBUG_BYTES];
    }
    let length = 8 + debug.len();
    let mut frame = Vec::with_capacity(9 + length);
    frame.extend_from_slice(&(length as u32).to_be_bytes()[1..]);
    frame.push(GOAWAY);
    frame.push(0); // flags
    frame.extend_from_slice(&0u32.to_be_bytes()); // stream 0: the connection
    frame.extend_from_slice(&0u32.to_be_bytes()); // last stream processed: none
    frame.extend_from_slice(&code.to_be_bytes());
    frame.extend_from_slice(debug);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goaway_frame_is_well_formed() {
        let frame = goaway_frame(INTERNAL_ERROR, "executor died");
        assert_eq!(&frame[..3], &[0, 0, 8 + 13]);
        assert_eq!(frame[3], GOAWAY);
        assert_eq!(&frame[5..9], &[0, 0, 0, 0]);
        assert_eq!(&frame[9..13], &[0, 0, 0, 0]);
        assert_eq!(&frame[13..17], &[0, 0, 0, 2]);
        assert_eq!(&frame[17..], b"executor died");
        assert_eq!(
            goaway_frame(ENHANCE_YOUR_CALM, &"x".repeat(10_000)).len(),
            9 + 8 + MAX_DEBUG_BYTES
        );
    }
}
