//! Failed runs by TensorFlow error code, server-wide: graph runs and eager
//! requests that failed, counted where they fail. Process-wide like the
//! TensorFlow runtime itself (one per process), so jobs need no handle to it.

use std::sync::atomic::{AtomicU64, Ordering};

pub use salus_proto::tensorflow::error::Code as TfCode;

/// TensorFlow's codes are 0 (OK) to 16 (UNAUTHENTICATED).
const CODES: usize = 17;

static FAILED_BY_CODE: [AtomicU64; CODES] = [const { AtomicU64::new(0) }; CODES];

/// Counts one failed run (a graph run, or an eager request's failed item).
pub fn record(code: TfCode) {
    if let Some(counter) = FAILED_BY_CODE.get(code as usize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// (code, failures) for every error code (OK excluded), zeros included so
/// every series exists from the start.
pub fn snapshot() -> Vec<(TfCode, u64)> {
    (1..CODES as i32)
        .filter_map(|code| TfCode::try_from(code).ok())
        .map(|code| (code, FAILED_BY_CODE[code as usize].load(Ordering::Relaxed)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_code() {
        let before = snapshot();
        assert_eq!(before.len(), 16);
        record(TfCode::ResourceExhausted);
        record(TfCode::ResourceExhausted);
        record(TfCode::InvalidArgument);
        let after = snapshot();
        let delta = |code: TfCode| {
            let find =
                |s: &[(TfCode, u64)]| s.iter().find(|(c, _)| *c == code).map_or(0, |(_, n)| *n);
            find(&after) - find(&before)
        };
        assert!(delta(TfCode::ResourceExhausted) >= 2);
        assert!(delta(TfCode::InvalidArgument) >= 1);
    }
}
