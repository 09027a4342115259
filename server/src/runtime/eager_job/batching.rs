//! The context's queue: requests in flight, bounded, and how one is
//! submitted to the context's thread (its `_Send`s announced, early ones sent).

use super::*;

pub(super) struct Batch {
    pub(super) items: Vec<Item>,
    /// The stream the request came on (none for a unary Enqueue).
    pub(super) stream: Option<Arc<StreamState>>,
    pub(super) reply: oneshot::Sender<Result<Vec<ItemOutput>>>,
    /// Its place among the context's requests in flight, given back when
    /// the context's thread is done with it.
    _admitted: BatchPermit,
}

/// Requests (`Enqueue` calls, `StreamingEnqueue` messages) of one eager
/// context read from its clients and not yet run: a client that sends faster
/// than its context runs is not read further (its stream waits, under HTTP/2
/// flow control; a unary call waits before it is queued) until one has run.
/// TensorFlow's client pipelines its async ops; a few hundred ahead keeps it
/// busy while bounding what one client makes the server hold.
pub const MAX_BATCHES_IN_FLIGHT: usize = 256;

/// One request's place among its context's requests in flight.
pub type BatchPermit = tokio::sync::OwnedSemaphorePermit;

/// The bound on one context's requests in flight ([`MAX_BATCHES_IN_FLIGHT`]).
pub struct BatchBound {
    permits: Arc<tokio::sync::Semaphore>,
}

impl BatchBound {
    pub fn new(max: usize) -> BatchBound {
        BatchBound {
            permits: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
        }
    }

    /// Waits until the context has room for one more request; None once the
    /// bound was closed (the context ended).
    pub async fn admit(&self) -> Option<BatchPermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Requests in flight now.
    pub fn in_flight(&self, max: usize) -> usize {
        max.max(1).saturating_sub(self.permits.available_permits())
    }

    /// Wakes every waiting request with None, and every later one.
    pub fn close(&self) {
        self.permits.close();
    }
}

impl EagerJob {
    /// Waits for room for one more request of this context (at most
    /// [`MAX_BATCHES_IN_FLIGHT`] read and not yet run); fails once the
    /// context is closed.
    pub async fn admit(&self) -> Result<BatchPermit> {
        self.admitted.admit().await.ok_or_else(|| self.gone())
    }

    /// Queues a request admitted by [`EagerJob::admit`]; the receiver yields
    /// its outputs once it has run. `_Send` ops are announced at once so that
    /// early pulls wait for them.
    pub fn submit(
        &self,
        mut items: Vec<Item>,
        stream: Option<Arc<StreamState>>,
        admitted: BatchPermit,
    ) -> Result<oneshot::Receiver<Result<Vec<ItemOutput>>>> {
        self.touch();
        let (reply, rx) = oneshot::channel();
        let Some(reply) = crate::runtime::stall_fault::stall(&items, reply, admitted) else {
            return Ok(rx);
        };
        let (reply, admitted) = reply;
        let names: Vec<String> = items.iter().filter_map(Item::send_tensor_name).collect();
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queue.as_ref() else {
            return Err(self.gone());
        };
        self.shared
            .rendezvous
            .announce_all(&names, crate::runtime::rendezvous::MAX_UNPULLED)?;
        let early = if self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            take_ready_sends(&self.shared, &mut items)
        } else {
            Vec::new()
        };
        // A failure held for the stream's next value read: an early read
        // reports it too (see `run_batch`).
        let held = match (&stream, early.is_empty()) {
            (Some(stream), false) => stream.take_held(),
            _ => None,
        };
        if !early.is_empty()
            && stream.is_none()
            && items.iter().all(|item| matches!(item, Item::SentEarly(_)))
        {
            // A unary request of nothing but such sends is answered once they
            // are delivered: its client thread waits for that before it pulls.
            let outputs = vec![ItemOutput::default(); items.len()];
            send_ready_values(
                Arc::clone(&self.shared),
                early,
                None,
                Some((reply, outputs)),
            );
            return Ok(rx);
        }
        send_ready_values(Arc::clone(&self.shared), early, held, None);
        // Before the batch can reach the context's thread, which forgets each as it applies it.
        let decrefs: Vec<(i64, i32)> = items.iter().filter_map(Item::decref_of).collect();
        self.shared.note_pending_decrefs(&decrefs, true);
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        if queue
            .send(Batch {
                items,
                stream,
                reply,
                _admitted: admitted,
            })
            .is_err()
        {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.shared.note_pending_decrefs(&decrefs, false);
            for name in &names {
                self.shared.rendezvous.deliver(
                    name,
                    Err(TfError::new(
                        TfCode::FailedPrecondition as i32,
                        "the eager context was closed",
                    )),
                );
            }
            return Err(self.gone());
        }
        Ok(rx)
    }

    /// Queues a request and waits for its outputs.
    pub async fn run(&self, items: Vec<Item>) -> Result<Vec<ItemOutput>> {
        let admitted = self.admit().await?;
        let rx = self.submit(items, None, admitted)?;
        rx.await.unwrap_or_else(|_| Err(self.gone()))
    }

    /// Waits for the tensor a `_Send` op of this context sends as `name`.
    pub async fn recv(&self, name: &str, grace: Duration) -> Result<Sent> {
        self.touch();
        self.shared.rendezvous.recv(name, grace).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_context_admits_a_bounded_number_of_requests_until_one_has_run() {
        let bound = BatchBound::new(3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(bound.admit().await.expect("room"));
        }
        assert_eq!(bound.in_flight(3), 3);
        // The fourth waits: its stream is not read further.
        let fourth = tokio::time::timeout(Duration::from_millis(50), bound.admit()).await;
        assert!(fourth.is_err(), "a request beyond the bound waits");
        // One has run: the next is admitted.
        held.pop();
        let fourth = tokio::time::timeout(Duration::from_secs(5), bound.admit()).await;
        assert!(fourth.expect("admitted once one ran").is_some());
    }

    #[tokio::test]
    async fn closing_the_context_wakes_requests_waiting_for_room() {
        let bound = Arc::new(BatchBound::new(1));
        let _held = bound.admit().await.expect("room");
        let waiting = tokio::spawn({
            let bound = bound.clone();
            async move { bound.admit().await.is_none() }
        });
        tokio::task::yield_now().await;
        bound.close();
        assert!(waiting.await.unwrap(), "a closed context admits nothing");
        assert!(bound.admit().await.is_none());
    }
}
