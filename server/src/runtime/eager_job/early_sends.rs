//! `_Send` ops: values handed to the client's pulls, in order or, when the
//! value exists already, ahead of the requests queued before them.

use super::*;

/// A `_Send` that can go before the requests queued ahead of it: its value
/// exists already.
pub(super) struct ReadySend {
    name: String,
    send_id: i64,
    op_id: i64,
    output: i32,
}

/// Takes the `_Send`s of `items` whose input handle exists now, leaving
/// `Item::SentEarly` in their place. Called while the context's thread is
/// busy: a Python callback of the call it runs may be what pulls such a value
/// (a generator yielding a tensor that lives here), and queued, its send would
/// wait for that call, which waits for the callback. A value that exists is
/// the same whenever it is read, so sending it early changes nothing else.
pub(super) fn take_ready_sends(shared: &Shared, items: &mut [Item]) -> Vec<ReadySend> {
    // Waiting on the table at most for an insert or a take: the context's
    // thread frees nothing and calls no TensorFlow while it writes it.
    let table = read(&shared.handles);
    let pending = lock(&shared.pending_decrefs);
    // Released by this request ahead of the send, or by an earlier one still queued: in order, it fails.
    let mut released: HashSet<(i64, i32)> = HashSet::new();
    let mut ready = Vec::new();
    for item in items.iter_mut() {
        if let Some(handle) = item.decref_of() {
            released.insert(handle);
            continue;
        }
        let Item::Execute(op) = item else { continue };
        let Some(name) = op.send_tensor_name() else {
            continue;
        };
        let [OpInput::Handle { op_id, output }] = op.inputs.as_slice() else {
            continue;
        };
        let handle = (*op_id, *output);
        let exists = find_handle(&table, *op_id, *output).is_some()
            && !released.contains(&handle)
            && !pending.contains_key(&handle);
        if exists {
            ready.push(ReadySend {
                name: name.clone(),
                send_id: op.id,
                op_id: *op_id,
                output: *output,
            });
            *item = Item::SentEarly(name);
        }
    }
    ready
}

/// Delivers `ready`'s values to their pulls off the async runtime (resolving
/// a handle is a TensorFlow call), then answers `reply` if given. A `held`
/// failure goes to the first pull instead of its value.
pub(super) fn send_ready_values(
    shared: Arc<Shared>,
    ready: Vec<ReadySend>,
    mut held: Option<TfError>,
    reply: Option<(oneshot::Sender<Result<Vec<ItemOutput>>>, Vec<ItemOutput>)>,
) {
    if ready.is_empty() {
        return;
    }
    let work = move || {
        let mut failure = None;
        for send in ready {
            if let Some(held) = held.take() {
                shared.rendezvous.deliver(&send.name, Err(held));
                continue;
            }
            let value = {
                let table = read(&shared.handles);
                find_handle(&table, send.op_id, send.output)
                    .ok_or_else(|| unknown_handle(shared.context_id, send.op_id, send.output))
                    .and_then(|handle| sent(send.send_id, handle))
            };
            let delivered = value.map_err(|err| {
                let failed = err.to_tf_error();
                failure.get_or_insert(err);
                failed
            });
            shared.rendezvous.deliver(&send.name, delivered);
        }
        if let Some((reply, outputs)) = reply {
            let _ = reply.send(match failure {
                Some(err) => Err(err),
                None => Ok(outputs),
            });
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(work)),
        Err(_) => work(),
    }
}

/// What a `_Send` of `handle` (op `op_id`) hands its pull.
pub(super) fn sent(op_id: i64, handle: &TensorHandle) -> Result<Sent> {
    let tensor = handle
        .resolve()?
        .into_proto()
        .map_err(|e| Error::tensor(format!("_Send {op_id}"), e))?;
    let sent_micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    Ok(Sent {
        tensor,
        sent_micros,
    })
}

impl Worker {
    /// A `_Send` op: its input's value goes to the pull waiting for `name`.
    pub(super) fn send(&self, op: &OpRequest, name: &str) -> Result<()> {
        let value = self.sent_value(op);
        let delivered = match &value {
            Ok(sent) => Ok(sent.clone()),
            Err(err) => Err(err.to_tf_error()),
        };
        self.shared.rendezvous.deliver(name, delivered);
        value.map(|_| ())
    }

    pub(super) fn sent_value(&self, op: &OpRequest) -> Result<Sent> {
        let table = read(&self.shared.handles);
        let handle = match op.inputs.as_slice() {
            [OpInput::Handle { op_id, output }] => self.handle(&table, *op_id, *output)?,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "_Send op {} needs exactly one input, a tensor handle of this context",
                    op.id
                )))
            }
        };
        sent(op.id, handle)
    }
}
