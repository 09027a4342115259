//! The seam between the supervisor and a tenant's executor process: typed
//! messages (`salus.seam.v1`, generated), their framing on a Unix socket
//! ([`frame`]), and the executor's end of it ([`client::SeamClient`], behind
//! the runtime's `Executor` and `Admission` in an executor process). The
//! supervisor's end is `supervisor::link`. Client connections cross to the
//! executor on a socket of their own ([`handover`]). Neither side's types cross it:
//! job ids, lanes, hints and memory needs travel as plain fields.

pub mod adoption;
pub mod client;
pub mod contract;
pub mod frame;
pub mod handover;
pub mod mirror;
pub mod replayed;
pub mod rows;

pub use salus_proto::salus::seam::v1 as msg;

/// The seam's protocol, in every executor's `Hello`: the supervisor refuses an
/// executor that speaks another (bump it with any change to seam.proto's
/// messages or their meaning).
pub const PROTOCOL: u32 = 3;

use crate::sched::Hints;

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine,
/// so the two ends of the seam can time a message between them.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Hints as they cross the seam.
pub fn hints_to_msg(hints: &Hints) -> msg::JobHints {
    msg::JobHints {
        name: hints.name.clone(),
        priority: hints.priority,
        expected_iterations: hints.expected_iterations,
        expected_seconds: hints.expected_seconds,
        persistent_bytes: hints.persistent_bytes,
        ephemeral_bytes: hints.ephemeral_bytes,
    }
}

pub fn hints_from_msg(hints: Option<msg::JobHints>) -> Hints {
    let h = hints.unwrap_or_default();
    Hints {
        name: h.name,
        priority: h.priority,
        expected_iterations: h.expected_iterations,
        expected_seconds: h.expected_seconds,
        persistent_bytes: h.persistent_bytes,
        ephemeral_bytes: h.ephemeral_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_round_trip() {
        let hints = Hints {
            name: "resnet".into(),
            priority: -3,
            expected_iterations: Some(7),
            expected_seconds: Some(1.5),
            persistent_bytes: None,
            ephemeral_bytes: Some(1 << 20),
        };
        assert_eq!(hints_from_msg(Some(hints_to_msg(&hints))), hints);
        assert_eq!(hints_from_msg(None), Hints::default());
    }
}
