//! One op or function call: its inputs, its class and turn, its outputs.

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
        let mut inline = Vec::new();
        for input in &op.inputs {
            if let OpInput::Tensor(proto) = input {
                let tensor =
                    Tensor::from_proto(proto, self.shared.max_tensor_bytes).map_err(|e| {
                        Error::tensor(format!("input of op {} ({})", op.id, op.name), e)
                    })?;
                inline.push(self.place(TensorHandle::from_tensor(&tensor)?, &device)?);
            }
        }
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
        let profile = if is_call {
            self.profiles.get(&op.name).copied().unwrap_or_default()
        } else {
            RunProfile::default()
        };
        if is_call && self.shared.sched.draining.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        let class = if is_call {
            let class = profile.classify(
                self.shared.sched.cheap_below.as_nanos() as f64,
                op.name.contains(MAIN_MARKER),
            );
            self.shared.sched.port.resolve(self.shared.id, class)
        } else {
            RunClass::Cheap
        };
        // A main iteration waits for memory (first time) and for its turn on
        // the lane; the turn ends when this call has run.
        let _turn = match class {
            RunClass::Cheap | RunClass::Brief => None,
            RunClass::Main => {
                if self.shared.history.first_main() {
                    let shape = self.function_shapes.get(&op.name).copied();
                    self.shared.sched.port.set_fingerprint(
                        self.shared.id,
                        &shape.unwrap_or_default().fingerprint('f'),
                    );
                }
                self.admit()?;
                Some(self.wait_for_turn()?)
            }
        };
        let sample = is_call
            && self.shared.sched.measure_memory
            && (MEMORY_SAMPLE_RUNS.contains(&(profile.runs + 1))
                || self.pending_samples.contains(&op.name));
        let trace_turn = if sample {
            memory_profile::TRACE_TURN.try_lock().ok()
        } else {
            None
        };
        // A sample that another job's held the turn from is taken at the
        // function's next call (as graph jobs do), not dropped.
        if sample && trace_turn.is_none() {
            self.pending_samples.insert(op.name.clone());
        } else if trace_turn.is_some() {
            self.pending_samples.remove(&op.name);
        }
        // A sample reads the device allocator's peak where it keeps one (a GPU,
        // TensorFlow's CPU allocator), else the heap's rise.
        let allocator = if trace_turn.is_some() {
            self.device_allocator(&device)
        } else {
            None
        };
        let started = Instant::now();
        let run = || {
            self.ctx.execute(
                &op.name,
                &device,
                &inputs,
                &attrs,
                &mut self.slots.borrow_mut(),
            )
        };
        let (executed, sample) = if trace_turn.is_some() {
            // The heap counts too where the device's memory is the host's.
            let heap = allocator.is_none_or(|a| a.on_host());
            let (executed, sample) = memory_profile::measure(allocator, heap, run);
            (executed, Some(sample))
        } else {
            (run(), None)
        };
        let ended = Instant::now();
        let elapsed = ended.duration_since(started);
        // Single ops are not runs (nor counted like them: they would take the
        // executor's lock on every op); a function call that went at once is
        // (`resolve` turned a brief one into Cheap or Main).
        if is_call && class == RunClass::Cheap {
            self.shared
                .sched
                .port
                .record_cheap_run(self.shared.id, started, ended);
        }
        drop(inputs);
        drop(table);
        drop(_turn);
        drop(trace_turn);
        if let (Some(sample), true) = (sample, executed.is_ok()) {
            self.record_memory_sample(&op.name, &sample);
        }
        if is_call {
            self.profiles
                .entry(op.name.clone())
                .or_default()
                .record(elapsed.as_nanos() as f64);
        }
        if class == RunClass::Main {
            let failed = executed.as_ref().err().map(|e| {
                salus_proto::tensorflow::error::Code::try_from(e.code)
                    .unwrap_or(salus_proto::tensorflow::error::Code::Unknown)
            });
            self.shared.history.main_ended(failed);
        }
        let outputs = match executed {
            Ok(outputs) => outputs,
            Err(err) => {
                if is_call
                    && err.code == salus_proto::tensorflow::error::Code::ResourceExhausted as i32
                {
                    let raised = ephemeral_after_oom(
                        self.shared.ephemeral_measured.bytes(),
                        lock(&self.shared.variables).bytes,
                    );
                    self.shared
                        .ephemeral_measured
                        .record(raised, MemoryMeter::OutOfMemory);
                    tracing::warn!(
                        job = self.shared.id.0,
                        ephemeral = raised,
                        "function call ran out of memory; estimate raised"
                    );
                }
                return Err(err.into());
            }
        };
        if op.name == "VarHandleOp" {
            self.record_variable(op);
        }
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

    /// Gives the job a memory lane before its first main iteration (memory
    /// admission on); waits while memory is short, up to the admission timeout.
    pub(super) fn admit(&self) -> Result<()> {
        let Some(admission) = &self.shared.sched.admission else {
            return Ok(());
        };
        if lock(&self.shared.reservation).is_some() {
            return Ok(());
        }
        let hints = self.shared.current_hints();
        let need = self.shared.memory_estimate(&hints).need;
        let reservation = self.shared.sched.runtime.block_on(admission.admit(
            self.shared.id,
            need,
            self.shared.sched.gpu_lane,
            hints,
        ))?;
        *lock(&self.shared.reservation) = Some(reservation);
        Ok(())
    }

    /// Queues a main iteration with the scheduler and waits, on this job's
    /// thread, until it is this job's turn; the call runs here while the
    /// returned turn is held (see [`SchedPort::wait_turn`]).
    pub(super) fn wait_for_turn(&self) -> Result<MainTurn> {
        self.shared.sched.port.wait_turn(self.shared.id, None)
    }
}
