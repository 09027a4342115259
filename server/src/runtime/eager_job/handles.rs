//! The client's tensor handles of one context: the table, lookups, stores
//! and decrefs (counted while queued, so an early send never reads a handle
//! the client already released).

use super::*;

pub(super) fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// The client's tensor handles of one context, by op id.
pub(super) type HandleTable = HashMap<i64, Vec<Option<TensorHandle>>>;

/// Output `output` of op `op_id`, if it exists and is not released.
pub(super) fn find_handle(table: &HandleTable, op_id: i64, output: i32) -> Option<&TensorHandle> {
    table
        .get(&op_id)?
        .get(usize::try_from(output).ok()?)?
        .as_ref()
}

pub(super) fn unknown_handle(context_id: u64, op_id: i64, output: i32) -> Error {
    Error::InvalidArgument(format!(
        "unknown tensor handle {op_id}:{output} in eager context {context_id}: no op with that id produced \
         that output, or the client released it"
    ))
}

impl Shared {
    /// Counts decrefs queued (`queued`) or applied or given up (not `queued`).
    pub(super) fn note_pending_decrefs(&self, handles: &[(i64, i32)], queued: bool) {
        if handles.is_empty() {
            return;
        }
        let mut pending = lock(&self.pending_decrefs);
        for handle in handles {
            if queued {
                *pending.entry(*handle).or_insert(0) += 1;
            } else if let Some(count) = pending.get_mut(handle) {
                *count -= 1;
                if *count == 0 {
                    pending.remove(handle);
                }
            }
        }
    }
}

impl Worker {
    /// Keeps an op's outputs as the client's handles `op_id:0..n`, within the
    /// per-context limit (`--max-context-handles`).
    pub(super) fn store(&mut self, op_id: i64, outputs: Vec<TensorHandle>) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        let max = self.shared.tenant.max_context_handles;
        if self.live_handles + outputs.len() > max {
            return Err(Error::ResourceExhausted(format!(
                "eager context {} already holds {} tensor handles; this server allows {max} per context \
                 (--max-context-handles)",
                self.shared.context_id, self.live_handles
            )));
        }
        self.live_handles += outputs.len();
        self.failed_ops.remove(&op_id);
        write(&self.shared.handles).insert(op_id, outputs.into_iter().map(Some).collect());
        Ok(())
    }

    pub(super) fn check_new_id(&self, op_id: i64) -> Result<()> {
        if read(&self.shared.handles).contains_key(&op_id) {
            return Err(Error::InvalidArgument(format!(
                "operation id {op_id} is already in use in eager context {}: every op and send_tensor needs a new id",
                self.shared.context_id
            )));
        }
        Ok(())
    }

    /// Handle `op_id:output` of `table` (a read guard of `Shared::handles`).
    pub(super) fn handle<'t>(
        &self,
        table: &'t HandleTable,
        op_id: i64,
        output: i32,
    ) -> Result<&'t TensorHandle> {
        if let Some(cause) = self.failed_ops.get(&op_id) {
            return Err(Error::Tensorflow(TfError::new(
                cause.code,
                format!(
                    "{} (tensor handle {op_id}:{output} was not produced because of it)",
                    cause.message
                ),
            )));
        }
        find_handle(table, op_id, output)
            .ok_or_else(|| unknown_handle(self.shared.context_id, op_id, output))
    }

    /// Tensors the client pushes: outputs `0..n` of `op_id`, on `device`.
    pub(super) fn push_tensors(
        &mut self,
        op_id: i64,
        tensors: &[TensorProto],
        device: &str,
    ) -> Result<()> {
        self.check_new_id(op_id)?;
        let device = self.local_device(device)?;
        let mut handles = Vec::with_capacity(tensors.len());
        for (i, proto) in tensors.iter().enumerate() {
            let tensor = Tensor::from_proto(proto, self.shared.max_tensor_bytes)
                .map_err(|e| Error::tensor(format!("send_tensor {op_id}:{i}"), e))?;
            handles.push(self.place(TensorHandle::from_tensor(&tensor)?, &device)?);
        }
        self.store(op_id, handles)?;
        Ok(())
    }

    /// Releases the client's handle `op_id:output` (a decref).
    pub(super) fn release(&mut self, op_id: i64, output: i32) {
        // Lenient like a destructor: the outputs of a failed op never existed.
        let released = {
            let mut handles = write(&self.shared.handles);
            self.shared.note_pending_decrefs(&[(op_id, output)], false);
            let mut released = None;
            if let Some(outputs) = handles.get_mut(&op_id) {
                released = usize::try_from(output)
                    .ok()
                    .and_then(|i| outputs.get_mut(i))
                    .and_then(Option::take);
                if outputs.iter().all(Option::is_none) {
                    handles.remove(&op_id);
                }
            }
            released
        };
        if released.is_some() {
            self.live_handles -= 1;
        }
        // Freed with the table unlocked: the last handle of a dataset
        // iterator waits for its prefetch thread, whose Python callback
        // may be reading a tensor of this context (an early send, which
        // needs the table).
        drop(released);
    }
}
