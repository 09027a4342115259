//! One op or function call: its inputs, its outputs, and for a call the one
//! main iteration (`runtime::main_iteration`: cheap, or main in its turn) with
//! its memory sampled when due.

use super::*;

impl Worker {
    /// TensorFlow's messages name the context's devices (`/job:localhost/...`);
    /// the client knows them by its own names for the server.
    pub(super) fn in_client_names(&self, err: Error) -> Error {
        match err {
            Error::Tensorflow(mut e) => {
                e.message = e.message.replace(
                    "/job:localhost/replica:0/task:0",
                    &self.shared.devices.client_prefix(),
                );
                Error::Tensorflow(e)
            }
            other => other,
        }
    }

    pub(super) fn local_device(&self, device: &str) -> Result<String> {
        self.shared
            .devices
            .to_local(device)
            .map_err(|e| Error::InvalidArgument(e.to_string()))
    }

    /// Host tensors placed on a GPU device when the client asked for one.
    pub(super) fn place(&self, handle: TensorHandle, device: &str) -> Result<TensorHandle> {
        if device.is_empty() || device.to_ascii_uppercase().contains("CPU") {
            return Ok(handle);
        }
        Ok(handle.copy_to_device(&self.ctx, device)?)
    }

    pub(super) fn execute(&mut self, op: &OpRequest) -> Result<ItemOutput> {
        if matches!(op.name.as_str(), "_Recv" | "_HostRecv") {
            return Err(Error::Unimplemented(format!(
                "{} ops pull tensors from the client's devices, which the Salus server cannot reach; \
                 the client sends tensors with send_tensor instead",
                op.name
            )));
        }
        // Also for function calls: TensorFlow resolves a name to a primitive op
        // before a function, so a function named like a refused op is that op.
        self.shared.tenant.check_eager_op(&op.name)?;
        if let Some(refusal) = self.refusal(op) {
            return Err(refusal);
        }
        self.check_new_id(op.id)?;
        let device = self.local_device(&op.device)?;
        let inline = self.inline_inputs(op, &device)?;
        let confined = self.confine_checkpoint_paths(op)?;
        let mut inline_iter = inline.iter();
        // Held while the op runs (its inputs borrow the table); early sends
        // read it meanwhile, and nothing writes it until the op is done.
        let shared = Arc::clone(&self.shared);
        let table = read(&shared.handles);
        let mut inputs = Vec::with_capacity(op.inputs.len());
        for (index, input) in op.inputs.iter().enumerate() {
            if let Some(path) = confined.get(&index) {
                if matches!(input, OpInput::Tensor(_)) {
                    inline_iter.next(); // the client's path, replaced
                }
                inputs.push(path);
                continue;
            }
            match input {
                OpInput::Handle { op_id, output } => {
                    inputs.push(self.handle(&table, *op_id, *output)?)
                }
                OpInput::Tensor(_) => inputs.extend(inline_iter.next()),
            }
        }
        let attrs: Vec<(&str, &[u8])> = op
            .attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_ref()))
            .collect();
        let is_call = op.is_function || self.functions.contains_key(&op.name);
        // Single ops are not runs (nor counted like them: they would take the
        // executor's lock on every op).
        let executed = if is_call {
            self.call(op, &device, &inputs, &attrs)?
        } else {
            self.run_op(&op.name, &device, &inputs, &attrs)
        };
        drop(inputs);
        drop(table);
        let outputs = match executed {
            Ok(outputs) => outputs,
            Err(err) => {
                if is_call && err.code == TfCode::ResourceExhausted as i32 {
                    self.shared
                        .memory
                        .raise_after_out_of_memory(self.shared.id, "function call");
                }
                return Err(err.into());
            }
        };
        if op.name == "VarHandleOp" {
            self.record_variable(op);
        }
        self.keep_outputs(op, outputs)
    }

    /// The op's inline tensor inputs, as handles on `device`.
    fn inline_inputs(&self, op: &OpRequest, device: &str) -> Result<Vec<TensorHandle>> {
        let mut inline = Vec::new();
        for input in &op.inputs {
            if let OpInput::Tensor(proto) = input {
                let tensor =
                    Tensor::from_proto(proto, self.shared.max_tensor_bytes).map_err(|e| {
                        Error::tensor(format!("input of op {} ({})", op.id, op.name), e)
                    })?;
                inline.push(self.place(TensorHandle::from_tensor(&tensor)?, device)?);
            }
        }
        Ok(inline)
    }

    /// A function call, through the one main iteration: at once if it is
    /// cheap, else in the job's turn (memory admitted first). The outer error:
    /// it did not run (shutdown, admission, the scheduler); the inner one is
    /// TensorFlow's.
    fn call(
        &mut self,
        op: &OpRequest,
        device: &str,
        inputs: &[&TensorHandle],
        attrs: &[(&str, &[u8])],
    ) -> Result<std::result::Result<Vec<TensorHandle>, TfError>> {
        let profile = self.profiles.get(&op.name).copied().unwrap_or_default();
        let class = profile.classify(
            self.shared.sched.cheap_below.as_nanos() as f64,
            op.name.contains(MAIN_MARKER),
        );
        let due = self.shared.sched.measure_memory
            && sample_due(profile.runs, self.pending_samples.contains(&op.name));
        let shape = self.function_shapes.get(&op.name).copied();
        let shared = Arc::clone(&self.shared);
        let call = shared.sched.iterations.run_here(
            shared.iterating(),
            class,
            &shared.sched.runtime,
            || shape.unwrap_or_default().fingerprint('f'),
            || self.sampled_call(op, device, inputs, attrs, due),
        )?;
        // Recorded with the turn given back.
        if let (Some(sample), true) = (call.sample, call.executed.is_ok()) {
            self.record_memory_sample(&op.name, &sample);
        }
        self.profiles
            .entry(op.name.clone())
            .or_default()
            .record(call.elapsed.as_nanos() as f64);
        Ok(call.executed)
    }

    /// Runs the call, under the memory meters when its sample is `due` and
    /// the sampling turn is free; a sample another job held the turn from is
    /// taken at the function's next call (as graph jobs do), not dropped.
    fn sampled_call(
        &mut self,
        op: &OpRequest,
        device: &str,
        inputs: &[&TensorHandle],
        attrs: &[(&str, &[u8])],
        due: bool,
    ) -> CallOutcome {
        let turn = SampleTurn::try_take(due);
        if turn.left_pending() {
            self.pending_samples.insert(op.name.clone());
        } else if turn.sampling() {
            self.pending_samples.remove(&op.name);
        }
        // A sample reads the device allocator's peak where it keeps one (a GPU,
        // TensorFlow's CPU allocator), else the heap's rise.
        let allocator = if turn.sampling() {
            self.device_allocator(device)
        } else {
            None
        };
        let started = Instant::now();
        let run = || self.run_op(&op.name, device, inputs, attrs);
        let (executed, sample) = if turn.sampling() {
            // The heap counts too where the device's memory is the host's.
            let heap = allocator.is_none_or(|a| a.on_host());
            let (executed, sample) = memory_profile::measure(allocator, heap, run);
            (executed, Some(sample))
        } else {
            (run(), None)
        };
        CallOutcome {
            executed,
            sample,
            elapsed: started.elapsed(),
        }
    }

    /// Runs one op or function call in the context.
    fn run_op(
        &self,
        name: &str,
        device: &str,
        inputs: &[&TensorHandle],
        attrs: &[(&str, &[u8])],
    ) -> std::result::Result<Vec<TensorHandle>, TfError> {
        self.ctx
            .execute(name, device, inputs, attrs, &mut self.slots.borrow_mut())
    }

    /// Keeps the op's outputs as the client's handles and answers their shapes
    /// (and a function's, their devices).
    fn keep_outputs(&mut self, op: &OpRequest, outputs: Vec<TensorHandle>) -> Result<ItemOutput> {
        let mut result = ItemOutput::default();
        for output in &outputs {
            result.shapes.push(output.dims()?);
            if op.is_function {
                result
                    .devices
                    .push(self.shared.devices.to_client(&output.device_name()?));
            }
        }
        self.store(op.id, outputs)?;
        self.shared.stats.ops.fetch_add(1, Ordering::Relaxed);
        if op.is_function {
            self.shared
                .stats
                .function_calls
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(result)
    }
}

/// One function call as run: TensorFlow's result, its memory sample if one
/// was taken, and how long it took.
struct CallOutcome {
    executed: std::result::Result<Vec<TensorHandle>, TfError>,
    sample: Option<Sample>,
    elapsed: Duration,
}

impl RunOutcome for CallOutcome {
    fn failure(&self) -> Option<TfCode> {
        self.executed.failure()
    }
}
