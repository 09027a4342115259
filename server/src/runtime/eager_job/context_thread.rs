//! The context's thread: runs the queued requests one at a time, in order,
//! and what a failed request leaves for later ones.

use super::*;

impl Worker {
    /// The context's thread: creates the TFE context (`ready` says whether it
    /// could), runs the requests of `rx` until the job closes, then frees it.
    pub(super) fn serve(
        config: &[u8],
        shared: Arc<Shared>,
        rx: mpsc::Receiver<Batch>,
        ready: mpsc::SyncSender<Result<()>>,
    ) {
        let ctx = match EagerContext::new(config) {
            Ok(ctx) => ctx,
            Err(err) => {
                let _ = ready.send(Err(err.into()));
                return;
            }
        };
        CONTEXT_THREADS.fetch_add(1, Ordering::SeqCst);
        let _ = ready.send(Ok(()));
        Worker {
            live_handles: 0,
            functions: HashMap::new(),
            function_shapes: HashMap::new(),
            profiles: HashMap::new(),
            refused: HashMap::new(),
            failed_ops: HashMap::new(),
            last_failure: None,
            unsent: Vec::new(),
            slots: Default::default(),
            allocators: HashMap::new(),
            pending_samples: HashSet::new(),
            ctx,
            shared,
        }
        .run(rx);
        // The context's memory is free now; the heap keeps freed
        // memory for reuse (tf_env), so hand it back to the system:
        // always when the last context ended, else at most once a second.
        let last = CONTEXT_THREADS.fetch_sub(1, Ordering::SeqCst) == 1;
        heap_meter::return_free_memory(last);
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Batch>) {
        while let Ok(batch) = rx.recv() {
            let result = if self.shared.closing.load(Ordering::SeqCst) {
                Err(Error::ContextGone(closed_message(
                    self.shared.context_id,
                    "it was closed before this request ran",
                )))
            } else if batch
                .stream
                .as_ref()
                .is_some_and(|s| s.failed.load(Ordering::SeqCst))
            {
                Err(Error::ContextGone(
                    "an earlier request on this stream failed, so this one was not run".into(),
                ))
            } else {
                self.run_batch(&batch.items, batch.stream.as_deref())
            };
            if let Err(err) = &result {
                if let Some(stream) = &batch.stream {
                    stream.failed.store(true, Ordering::SeqCst);
                }
                self.remember_failure(&batch.items, err);
                tracing::debug!(context = self.shared.context_id, cause = %err, "eager request failed");
            }
            self.shared
                .stats
                .handles
                .store(self.live_handles as u64, Ordering::Relaxed);
            self.shared
                .stats
                .functions
                .store(self.functions.len() as u64, Ordering::Relaxed);
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = batch.reply.send(result);
            self.fail_unsent_pulls(batch.stream.as_deref());
        }
        // Handles before the context; freed with the table unlocked (see Decref).
        let handles = std::mem::take(&mut *write(&self.shared.handles));
        drop(handles);
        self.live_handles = 0;
    }

    /// Fails the pulls of the sends a failed request did not run. On a stream,
    /// only after the stream's error status went out: the client raises the
    /// pull's error at once and may queue its next request on the same stream,
    /// which, if it has not yet seen the stream end, fails too with the first
    /// error (the stock client then reported one failure twice).
    pub(super) fn fail_unsent_pulls(&mut self, stream: Option<&StreamState>) {
        if self.unsent.is_empty() {
            return;
        }
        if let Some(stream) = stream {
            stream.wait_until_status_sent(Duration::from_secs(2));
        }
        for (name, message) in self.unsent.drain(..) {
            self.shared.rendezvous.deliver(&name, Err(message));
        }
    }

    /// Records the ops of a failed request (those not run) with the failure
    /// that stopped them.
    pub(super) fn remember_failure(&mut self, items: &[Item], err: &Error) {
        const KEEP: usize = 4096;
        let cause = match err {
            // Skipped behind an earlier failure: that one is the cause.
            Error::ContextGone(_) => self.last_failure.clone(),
            other => Some(other.to_tf_error()),
        };
        let Some(cause) = cause else { return };
        if self.failed_ops.len() >= KEEP {
            self.failed_ops.clear();
        }
        for item in items {
            let id = match item {
                Item::Execute(op) => op.id,
                Item::SendTensors { op_id, .. } => *op_id,
                _ => continue,
            };
            if !read(&self.shared.handles).contains_key(&id) {
                self.failed_ops.entry(id).or_insert_with(|| cause.clone());
            }
        }
        self.last_failure = Some(cause);
    }

    pub(super) fn run_batch(
        &mut self,
        items: &[Item],
        stream: Option<&StreamState>,
    ) -> Result<Vec<ItemOutput>> {
        let mut outputs = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let held = stream
                .filter(|_| reports_held_failure(item))
                .and_then(StreamState::take_held);
            let result = match (held, item.send_tensor_name()) {
                // A value read reports it through its pull: the client raises
                // the pull's error (with its code) at the read, and the stream
                // goes on.
                (Some(held), Some(name)) => {
                    self.shared.rendezvous.deliver(&name, Err(held));
                    Ok(ItemOutput::default())
                }
                (Some(held), None) => Err(Error::Tensorflow(held)),
                (None, _) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_item(item)))
                        .unwrap_or_else(|_| {
                            Err(Error::Internal("an eager queue item panicked".into()))
                        })
                }
            };
            match result {
                Ok(output) => outputs.push(output),
                Err(err) => {
                    let err = self.in_client_names(err);
                    self.shared.stats.failed.fetch_add(1, Ordering::Relaxed);
                    crate::runtime::run_errors::record(err.code());
                    if let Some(stream) = stream.filter(|_| self.failure_is_silent(items, index)) {
                        tracing::debug!(context = self.shared.context_id, cause = %err,
                                        "an op without outputs failed; its stream's next read or sync reports it");
                        lock(&stream.held).get_or_insert_with(|| {
                            TfError::new(err.code() as i32, held_message(item, &err))
                        });
                        outputs.push(ItemOutput::default());
                        continue;
                    }
                    // A held failure came first: the script hears of it, not
                    // of a later symptom (a table "not initialized").
                    let err = match stream.and_then(StreamState::take_held) {
                        Some(held) => Error::Tensorflow(held),
                        None => err,
                    };
                    // Pulls waiting for sends that will not run now get the
                    // error, once the request's own answer is out (see run).
                    let code = err.code() as i32;
                    for later in &items[index + 1..] {
                        if let Some(name) = later.send_tensor_name() {
                            let why = format!("an earlier item of its request failed: {err}");
                            self.unsent.push((name, TfError::new(code, why)));
                        }
                    }
                    return Err(err);
                }
            }
        }
        Ok(outputs)
    }

    /// Whether item `index`, failed, is the request's last and an op (or
    /// function call) without outputs: nothing after it went unrun, and the
    /// client has no output that could carry its error.
    pub(super) fn failure_is_silent(&self, items: &[Item], index: usize) -> bool {
        if index + 1 != items.len() {
            return false;
        }
        match &items[index] {
            Item::Execute(op) if op.send_tensor_name().is_none() => {
                if op.is_function {
                    self.functions.get(&op.name).copied().unwrap_or(false)
                } else {
                    op_registry::has_no_outputs(&op.name)
                }
            }
            _ => false,
        }
    }

    pub(super) fn run_item(&mut self, item: &Item) -> Result<ItemOutput> {
        match item {
            Item::Execute(op) => match op.send_tensor_name() {
                Some(name) => self.send(op, &name).map(|()| ItemOutput::default()),
                None => self.execute(op),
            },
            Item::RegisterFunction {
                function_def,
                library,
            } => {
                self.register_with_library(function_def, library)?;
                Ok(ItemOutput::default())
            }
            Item::SendTensors {
                op_id,
                tensors,
                device,
            } => {
                self.push_tensors(*op_id, tensors, device)?;
                Ok(ItemOutput::default())
            }
            Item::Decref { op_id, output } => {
                self.release(*op_id, *output);
                Ok(ItemOutput::default())
            }
            Item::RemoveFunction(name) => {
                self.function_shapes.remove(name);
                if self.functions.remove(name).is_some() && self.ctx.has_function(name) {
                    self.ctx.remove_function(name)?;
                }
                Ok(ItemOutput::default())
            }
            Item::CleanupFunction | Item::Sync | Item::SentEarly(_) => Ok(ItemOutput::default()),
        }
    }
}
