//! Framing: a 4-byte little-endian length, then the encoded message. Blocking
//! I/O on dedicated threads at both ends (never on the async runtime).

use std::io::{self, Read, Write};

use prost::Message;

/// Largest frame either side accepts: a report of many jobs fits easily; a
/// length beyond it means the peer is not speaking the seam.
pub const MAX_FRAME: usize = 64 << 20;

/// Writes one message as a frame (one write call, so frames of concurrent
/// writers sharing a lock never interleave).
pub fn write_frame<W: Write, M: Message>(out: &mut W, message: &M) -> io::Result<()> {
    let len = message.encoded_len();
    let mut buf = Vec::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    message
        .encode(&mut buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    out.write_all(&buf)
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub fn read_frame<R: Read, M: Message + Default>(input: &mut R) -> io::Result<Option<M>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a seam frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    // Grown as bytes arrive: a peer that announces a large frame and sends
    // nothing holds no memory for it.
    let mut buf = Vec::with_capacity(len.min(64 << 10));
    input.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a seam frame ended after {} of its {len} bytes", buf.len()),
        ));
    }
    M::decode(buf.as_slice())
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::msg::{to_supervisor, Done, ToSupervisor, Want};

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let want = ToSupervisor {
            msg: Some(to_supervisor::Msg::Want(Want {
                turn: 7,
                job: 1 << 40,
                deadline_ms: 0,
                running: false,
            })),
        };
        let done = ToSupervisor {
            msg: Some(to_supervisor::Msg::Done(Done {
                turn: 7,
                go_delay_ns: 12_345,
            })),
        };
        write_frame(&mut a, &want).unwrap();
        write_frame(&mut a, &done).unwrap();
        drop(a);
        assert_eq!(read_frame::<_, ToSupervisor>(&mut b).unwrap(), Some(want));
        assert_eq!(read_frame::<_, ToSupervisor>(&mut b).unwrap(), Some(done));
        assert_eq!(read_frame::<_, ToSupervisor>(&mut b).unwrap(), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut huge = &[0xff, 0xff, 0xff, 0x7f][..];
        assert!(read_frame::<_, ToSupervisor>(&mut huge).is_err());
        let mut bad = &[3, 0, 0, 0, 0xff, 0xff, 0xff][..];
        assert!(read_frame::<_, ToSupervisor>(&mut bad).is_err());
        let mut short = &[9, 0, 0, 0, 1][..];
        assert!(read_frame::<_, ToSupervisor>(&mut short).is_err());
    }
}
