//! Fuzzes the seam's decoder: what the supervisor reads from an executor
//! (`ToSupervisor`) and an executor from its supervisor (`ToExecutor`), frame
//! by frame, as `seam::frame::read_frame` reads them off the socket. Under
//! tenant isolation an executor is its tenant's (a hostile graph may subvert
//! it), so every byte it sends the supervisor is untrusted.
//!
//! The input is a byte stream of frames (a 4-byte little-endian length, then
//! the message); it is read to its end both as `ToSupervisor` frames and as
//! `ToExecutor` frames. Invariants besides "no panic": a length over
//! `MAX_FRAME` is refused (and, with `-malloc_limit_mb=64`, never allocated);
//! each frame read consumes its 4 bytes of length and its body; each decoded
//! message survives `write_frame` and `read_frame` again unchanged.

#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use salus_server::seam::frame::{read_frame, write_frame, MAX_FRAME};
use salus_server::seam::msg::{ToExecutor, ToSupervisor};

fuzz_target!(|data: &[u8]| {
    frames::<ToSupervisor>(data);
    frames::<ToExecutor>(data);
});

/// Reads `data` as a stream of `M` frames until its end or the first error,
/// as the seam's reader threads do.
fn frames<M: Message + Default + PartialEq + Debug>(data: &[u8]) {
    let mut input = data;
    loop {
        let before = input.len();
        let claimed = input
            .get(..4)
            .map(|len| u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize);
        match read_frame::<_, M>(&mut input) {
            Ok(Some(message)) => {
                let claimed = claimed.expect("a frame has its length");
                assert!(claimed <= MAX_FRAME);
                assert_eq!(before - input.len(), 4 + claimed, "a frame is its length and body");
                let mut wire = Vec::new();
                write_frame(&mut wire, &message).expect("a decoded message encodes");
                let mut again = wire.as_slice();
                let back = read_frame::<_, M>(&mut again)
                    .expect("a written frame reads")
                    .expect("a written frame is there");
                assert_eq!(back, message, "a frame survives a round trip");
                assert!(again.is_empty());
            }
            Ok(None) => {
                // A clean end: nothing, or less than a length, was left.
                assert!(before < 4, "{before} bytes left at a clean end");
                return;
            }
            // Refused (an oversized length, a short body, a body that is no
            // message): the reader ends the seam there.
            Err(_) => return,
        }
    }
}
