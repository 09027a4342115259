//! TF_Session wrapper: runs, partial runs, devices, reset.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use tensorflow_sys as sys;

use super::buffer::{self, OutputBuffer};
use super::graph::{Graph, Operation};
use super::status::{with_status, Status, TfError};
use super::tensor::Tensor;

pub use salus_node::tf_types::DeviceInfo;

/// What one run produced.
pub struct RunOutput {
    pub outputs: Vec<Tensor>,
    /// Serialized RunMetadata, when asked for.
    pub metadata: Vec<u8>,
}

/// One TensorFlow session over a shared graph. All methods block: call them on
/// executor threads, never on the async runtime.
pub struct Session {
    ptr: NonNull<sys::TF_Session>,
    graph: Arc<Graph>,
}

// SAFETY: TF_Session is thread-safe for concurrent runs; close/delete happen in
// Drop when no other reference exists.
unsafe impl Send for Session {}
unsafe impl Sync for Session {}

/// Owned session options.
struct SessionOptions(*mut sys::TF_SessionOptions);

impl SessionOptions {
    fn new(config: &[u8]) -> Result<Self, TfError> {
        // SAFETY: options are owned by the returned wrapper; the config bytes are
        // only read during TF_SetConfig.
        let opts = SessionOptions(unsafe { sys::TF_NewSessionOptions() });
        if !config.is_empty() {
            with_status(|status| unsafe {
                sys::TF_SetConfig(opts.0, config.as_ptr() as *const _, config.len(), status)
            })?;
        }
        Ok(opts)
    }
}

impl Drop for SessionOptions {
    fn drop(&mut self) {
        // SAFETY: created by TF_NewSessionOptions, deleted once.
        unsafe { sys::TF_DeleteSessionOptions(self.0) }
    }
}

impl Session {
    pub(super) fn as_ptr(&self) -> *mut sys::TF_Session {
        self.ptr.as_ptr()
    }

    /// Creates a local session over `graph` with a serialized ConfigProto.
    pub fn new(graph: Arc<Graph>, config: &[u8]) -> Result<Session, TfError> {
        let opts = SessionOptions::new(config)?;
        // SAFETY: graph and options are live; TF copies what it needs from options.
        let ptr =
            with_status(|status| unsafe { sys::TF_NewSession(graph.as_ptr(), opts.0, status) })?;
        let ptr =
            NonNull::new(ptr).ok_or_else(|| TfError::new(13, "TF_NewSession returned null"))?;
        Ok(Session { ptr, graph })
    }

    pub fn graph(&self) -> &Arc<Graph> {
        &self.graph
    }

    /// One TF_SessionRun. Inputs are borrowed; outputs are returned in order.
    /// RunMetadata is collected only when `want_metadata`.
    pub fn run(
        &self,
        run_options: &[u8],
        want_metadata: bool,
        inputs: &[(sys::TF_Output, &Tensor)],
        outputs: &[sys::TF_Output],
        targets: &[Operation],
    ) -> Result<RunOutput, TfError> {
        let (input_ports, input_values): (Vec<_>, Vec<_>) =
            inputs.iter().map(|(o, t)| (*o, t.as_ptr())).unzip();
        let target_ptrs: Vec<*const sys::TF_Operation> =
            targets.iter().map(|op| op.as_ptr() as *const _).collect();
        let mut output_values: Vec<*mut sys::TF_Tensor> = vec![std::ptr::null_mut(); outputs.len()];
        let options = buffer::borrowed(run_options);
        let metadata = want_metadata.then(OutputBuffer::new);
        let status = Status::new();
        // SAFETY: every array has the length passed with it and outlives the call;
        // input tensors stay owned by the caller; TF writes owned tensors into
        // output_values, which are wrapped below (also on error, where TF may
        // have filled some).
        unsafe {
            sys::TF_SessionRun(
                self.ptr.as_ptr(),
                if run_options.is_empty() {
                    std::ptr::null()
                } else {
                    &options
                },
                input_ports.as_ptr(),
                input_values.as_ptr(),
                input_ports.len() as i32,
                outputs.as_ptr(),
                output_values.as_mut_ptr(),
                outputs.len() as i32,
                target_ptrs.as_ptr(),
                target_ptrs.len() as i32,
                metadata
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |m| m.as_ptr()),
                status.as_ptr(),
            );
        }
        let outputs = take_outputs(output_values, &status, "TF_SessionRun")?;
        Ok(RunOutput {
            outputs,
            metadata: metadata.map(|m| m.to_vec()).unwrap_or_default(),
        })
    }

    /// TF_SessionPRunSetup: declares every feed, fetch and target of a partial run.
    pub fn partial_run_setup(
        &self,
        inputs: &[sys::TF_Output],
        outputs: &[sys::TF_Output],
        targets: &[Operation],
    ) -> Result<PartialRunHandle, TfError> {
        let target_ptrs: Vec<*const sys::TF_Operation> =
            targets.iter().map(|op| op.as_ptr() as *const _).collect();
        let mut handle: *const c_char = std::ptr::null();
        // SAFETY: arrays live through the call; TF returns a handle we own.
        with_status(|status| unsafe {
            sys::TF_SessionPRunSetup(
                self.ptr.as_ptr(),
                inputs.as_ptr(),
                inputs.len() as i32,
                outputs.as_ptr(),
                outputs.len() as i32,
                target_ptrs.as_ptr(),
                target_ptrs.len() as i32,
                &mut handle,
                status,
            )
        })?;
        // SAFETY: on success `handle` is a NUL-terminated string we now own.
        let tf_handle = unsafe { CStr::from_ptr(handle) }.to_owned();
        unsafe { sys::TF_DeletePRunHandle(handle) };
        Ok(PartialRunHandle(tf_handle))
    }

    /// TF_SessionPRun: one step of a partial run.
    pub fn partial_run(
        &self,
        handle: &PartialRunHandle,
        inputs: &[(sys::TF_Output, &Tensor)],
        outputs: &[sys::TF_Output],
        targets: &[Operation],
    ) -> Result<Vec<Tensor>, TfError> {
        let (input_ports, input_values): (Vec<_>, Vec<_>) =
            inputs.iter().map(|(o, t)| (*o, t.as_ptr())).unzip();
        let target_ptrs: Vec<*const sys::TF_Operation> =
            targets.iter().map(|op| op.as_ptr() as *const _).collect();
        let mut output_values: Vec<*mut sys::TF_Tensor> = vec![std::ptr::null_mut(); outputs.len()];
        let status = Status::new();
        // SAFETY: as in `run`.
        unsafe {
            sys::TF_SessionPRun(
                self.ptr.as_ptr(),
                handle.0.as_ptr(),
                input_ports.as_ptr(),
                input_values.as_ptr(),
                input_ports.len() as i32,
                outputs.as_ptr(),
                output_values.as_mut_ptr(),
                outputs.len() as i32,
                target_ptrs.as_ptr(),
                target_ptrs.len() as i32,
                status.as_ptr(),
            );
        }
        take_outputs(output_values, &status, "TF_SessionPRun")
    }

    /// The devices this session runs on.
    pub fn list_devices(&self) -> Result<Vec<DeviceInfo>, TfError> {
        // SAFETY: live session; the list is read then deleted here; strings are copied.
        unsafe {
            let list = with_status(|status| sys::TF_SessionListDevices(self.ptr.as_ptr(), status))?;
            let result = (|| {
                let count = sys::TF_DeviceListCount(list);
                let mut devices = Vec::with_capacity(count.max(0) as usize);
                for i in 0..count {
                    let name = with_status(|s| sys::TF_DeviceListName(list, i, s))?;
                    let device_type = with_status(|s| sys::TF_DeviceListType(list, i, s))?;
                    devices.push(DeviceInfo {
                        name: CStr::from_ptr(name).to_string_lossy().into_owned(),
                        device_type: CStr::from_ptr(device_type).to_string_lossy().into_owned(),
                        memory_bytes: with_status(|s| sys::TF_DeviceListMemoryBytes(list, i, s))?,
                        incarnation: with_status(|s| sys::TF_DeviceListIncarnation(list, i, s))?,
                    });
                }
                Ok(devices)
            })();
            sys::TF_DeleteDeviceList(list);
            result
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let status = Status::new();
        // SAFETY: the last reference is gone, so no run is in flight; the session
        // is closed and deleted once. Errors are logged, never panicked on.
        unsafe {
            sys::TF_CloseSession(self.ptr.as_ptr(), status.as_ptr());
            if let Err(err) = status.check() {
                tracing::warn!(cause = %err, "closing a TensorFlow session failed");
            }
            sys::TF_DeleteSession(self.ptr.as_ptr(), status.as_ptr());
            if let Err(err) = status.check() {
                tracing::warn!(cause = %err, "deleting a TensorFlow session failed");
            }
        }
        // Blocks kept for this session's next step go back to the heap.
        crate::block_cache::drain();
    }
}

/// Takes ownership of the tensors a run wrote (also when it failed, since TF
/// may have filled some), then reports the run's status.
fn take_outputs(
    values: Vec<*mut sys::TF_Tensor>,
    status: &Status,
    call: &str,
) -> Result<Vec<Tensor>, TfError> {
    // SAFETY: non-null entries are tensors TF handed over to us.
    let tensors: Vec<Option<Tensor>> = values
        .into_iter()
        .map(|p| unsafe { Tensor::from_raw(p) })
        .collect();
    status.check()?;
    tensors
        .into_iter()
        .map(|t| t.ok_or_else(|| TfError::new(13, format!("{call} returned a null output"))))
        .collect()
}

/// TensorFlow's handle of a partial run set up with [`Session::partial_run_setup`].
#[derive(Debug)]
pub struct PartialRunHandle(CString);
