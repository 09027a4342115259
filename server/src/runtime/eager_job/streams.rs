//! StreamingEnqueue streams: what their requests share, the failure one holds
//! for its next read or sync, and ending a wait that nothing can end.

use super::*;

/// What the requests of one StreamingEnqueue stream share.
#[derive(Default)]
pub struct StreamState {
    /// Numbers the server's streams, for logs.
    pub id: u64,
    /// Set once a request failed: later ones are refused, as TensorFlow's
    /// worker ends the stream at the first error.
    pub failed: AtomicBool,
    /// The failure of a request whose last op has no outputs. The stock client
    /// does not wait for such an op (it only poisons outputs), so the request
    /// is answered as done and the stream's next value read or sync fails with
    /// this instead of running, as does a later item that fails on its own:
    /// the script hears of the failure at its next wait, not at a later,
    /// unrelated symptom (a table "not initialized").
    pub(super) held: Mutex<Option<TfError>>,
    /// Set once the stream's error status has been handed to the transport.
    status_sent: (Mutex<bool>, std::sync::Condvar),
    /// Why the server ends the stream ahead of its pending replies (a wait of
    /// the client's that nothing can end, `EagerJob::end_stalled_streams`).
    ended_because: Mutex<Option<String>>,
    ended: tokio::sync::Notify,
}

impl StreamState {
    pub fn new() -> StreamState {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        StreamState {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// Ends the stream with ABORTED and `reason`, ahead of replies still pending.
    pub fn end(&self, reason: String) {
        lock(&self.ended_because).get_or_insert(reason);
        self.ended.notify_one();
    }

    /// Resolves once [`StreamState::end`] was called, with its reason.
    pub async fn ended(&self) -> String {
        loop {
            if let Some(reason) = lock(&self.ended_because).clone() {
                return reason;
            }
            self.ended.notified().await;
        }
    }

    /// The failure held for the stream's next value read or sync, once.
    pub(super) fn take_held(&self) -> Option<TfError> {
        lock(&self.held).take()
    }

    /// Called by the stream's writer when it ended the stream with an error.
    pub fn mark_status_sent(&self) {
        *lock(&self.status_sent.0) = true;
        self.status_sent.1.notify_all();
    }

    /// Blocks (a context thread) until the stream's error status is out, or
    /// for `limit` at most.
    pub(super) fn wait_until_status_sent(&self, limit: Duration) {
        let sent = lock(&self.status_sent.0);
        let _ = self
            .status_sent
            .1
            .wait_timeout_while(sent, limit, |sent| !*sent)
            .map_err(|e| e.into_inner());
    }
}

/// What `EagerJob::end_stalled_streams` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StalledWait {
    Ended,
    /// A request is queued or running: the wait may still end.
    Busy,
    /// The context was used during the wait.
    Active,
    NoOpenStream,
}

impl StalledWait {
    pub fn label(self) -> &'static str {
        match self {
            StalledWait::Ended => "ended",
            StalledWait::Busy => "busy",
            StalledWait::Active => "active",
            StalledWait::NoOpenStream => "no open stream",
        }
    }
}

impl EagerJob {
    pub fn stream_opened(&self, stream: &Arc<StreamState>) {
        self.open_streams.fetch_add(1, Ordering::SeqCst);
        let mut streams = lock(&self.streams);
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(stream));
    }

    /// The client's thread has waited `waited` for this context with none of
    /// its own callbacks running: if nothing was queued or running here for
    /// all that time (short of a second's slack), no reply can still come,
    /// so the context's open streams end with ABORTED naming the wait, and
    /// the client's pending ops fail with it. The context goes on.
    pub fn end_stalled_streams(&self, waited: Duration, waiting_for: &str) -> StalledWait {
        let idle = self.idle_for();
        if self.is_busy() {
            return StalledWait::Busy;
        }
        if idle + Duration::from_secs(1) < waited {
            return StalledWait::Active;
        }
        let open: Vec<Arc<StreamState>> = lock(&self.streams)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|s| !s.failed.load(Ordering::SeqCst))
            .collect();
        if open.is_empty() {
            return StalledWait::NoOpenStream;
        }
        let reason = format!(
            "the script waited {:.0} s for {waiting_for}, while the Salus server had nothing queued or running \
             for this eager context for {:.0} s and no Python callback of the script was running: the wait \
             could never end, so the server ended the context's request stream (a lost request or a server \
             fault; please report it with the server's log). The context goes on",
            waited.as_secs_f64(),
            idle.as_secs_f64()
        );
        tracing::warn!(context = self.context_id, streams = open.len(), %reason, "ending a stalled wait");
        for stream in open {
            stream.end(reason.clone());
        }
        StalledWait::Ended
    }

    /// Returns the streams still open.
    pub fn stream_closed(&self) -> usize {
        self.open_streams
            .fetch_sub(1, Ordering::SeqCst)
            .saturating_sub(1)
    }

    pub fn open_streams(&self) -> usize {
        self.open_streams.load(Ordering::SeqCst)
    }
}

/// Whether `item` reports its stream's held failure instead of running: what
/// the client waits for, a sync or a value read (the `_Send` of a tensor it
/// pulls). Not an op with outputs: the client does not wait for one, and an
/// error answered to an op whose later ops are in flight may never reach the
/// script (TensorFlow's client then dropped 2 to 8 of 100 failed checkpoint
/// writes: the next read and sync passed).
pub(super) fn reports_held_failure(item: &Item) -> bool {
    match item {
        Item::Sync => true,
        Item::Execute(op) => op.send_tensor_name().is_some(),
        _ => false,
    }
}

/// The message a held failure is reported with, by a later call: it names the
/// op that failed, since the call that raises it is another.
pub(super) fn held_message(item: &Item, err: &Error) -> String {
    let what = match item {
        Item::Execute(op) if op.is_function => format!("function {}", op.name),
        Item::Execute(op) => format!("op {}", op.name),
        other => other.label(),
    };
    let text = err.to_string();
    let named = if text.contains(&what) {
        text
    } else {
        format!("{what}: {text}")
    };
    format!(
        "{named} (reported by this later call: the failed {what} has no outputs, so TensorFlow's \
         client did not wait for it)"
    )
}
