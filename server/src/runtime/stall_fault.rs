//! A fault for tests of the client's stalled waits: with `SALUS_FAULT_STALL_OP`
//! set to an op type, an eager request executing that op is neither run nor
//! answered, and the context shows nothing queued or running. The client's
//! wait for it can then only end through `PythonCallbacks/EndStalledWait`.
//! Never set outside tests.

use std::sync::{Mutex, OnceLock};

use tokio::sync::oneshot;

use crate::error::Result;
use crate::runtime::eager_items::{Item, ItemOutput};

type Reply = oneshot::Sender<Result<Vec<ItemOutput>>>;
// An eager context's place for one request in flight (`eager_job::BatchPermit`).
type Admitted = tokio::sync::OwnedSemaphorePermit;

fn stalled_op() -> Option<&'static str> {
    static OP: OnceLock<Option<String>> = OnceLock::new();
    OP.get_or_init(|| {
        let op = std::env::var("SALUS_FAULT_STALL_OP").ok().filter(|op| !op.is_empty());
        if let Some(op) = &op {
            tracing::warn!(op, "SALUS_FAULT_STALL_OP: eager requests executing this op are never answered (a test fault)");
        }
        op
    })
    .as_deref()
}

/// Whether the request must stall; if so its reply is kept, unanswered, for
/// the life of the process (dropping it would answer with an error), and so
/// is its place among its context's requests in flight.
pub fn stall(items: &[Item], reply: Reply, admitted: Admitted) -> Option<(Reply, Admitted)> {
    let Some(op) = stalled_op() else {
        return Some((reply, admitted));
    };
    if !items
        .iter()
        .any(|item| matches!(item, Item::Execute(e) if e.name == op))
    {
        return Some((reply, admitted));
    }
    static HELD: Mutex<Vec<(Reply, Admitted)>> = Mutex::new(Vec::new());
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push((reply, admitted));
    None
}
