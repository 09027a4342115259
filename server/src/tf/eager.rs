//! Safe wrappers over TensorFlow's eager C API (`TFE_*`): one eager context per
//! remote-eager client, its tensor handles, functions and op execution.
//!
//! Every call blocks (a sync context runs kernels on the calling thread), so
//! callers run them off the async runtime. A context and its handles are used
//! from one thread at a time; handles must be dropped before their context.

use std::ffi::{c_int, CStr, CString};
use std::ptr::NonNull;

use super::ffi::eager as ffi;
use super::status::{with_status, TfError};
use super::tensor::Tensor;

/// TensorFlow's INVALID_ARGUMENT code.
const INVALID_ARGUMENT: i32 = 3;

/// Outputs one op may return. TFE_Execute needs the capacity up front and fails
/// (before running anything) when an op has more outputs than that.
const MAX_OUTPUTS: usize = 4096;

fn c_string(what: &str, value: &str) -> Result<CString, TfError> {
    CString::new(value).map_err(|_| {
        TfError::new(
            INVALID_ARGUMENT,
            format!("{what} {value:?} contains a NUL byte"),
        )
    })
}

/// Output slots for [`EagerContext::execute`], allocated once per thread that
/// executes ops (TFE_Execute needs room for every output up front).
pub struct OutputSlots(Vec<*mut ffi::TFE_TensorHandle>);

// SAFETY: the slots only hold null or handles moved out at once.
unsafe impl Send for OutputSlots {}

impl Default for OutputSlots {
    fn default() -> Self {
        OutputSlots(vec![std::ptr::null_mut(); MAX_OUTPUTS])
    }
}

/// An owned `TFE_Context`.
pub struct EagerContext(NonNull<ffi::TFE_Context>);

// SAFETY: a TFE_Context may be used from any thread; the runtime uses each from
// one thread at a time.
unsafe impl Send for EagerContext {}
unsafe impl Sync for EagerContext {}

impl EagerContext {
    /// A synchronous context configured by a serialized ConfigProto. Inputs on
    /// another device are copied silently, as in TensorFlow's own eager worker.
    pub fn new(config: &[u8]) -> Result<EagerContext, TfError> {
        // SAFETY: options are created, used and deleted here; the config bytes
        // outlive the call that copies them.
        unsafe {
            let options = ffi::TFE_NewContextOptions();
            let configured = with_status(|s| {
                ffi::TFE_ContextOptionsSetConfig(options, config.as_ptr().cast(), config.len(), s)
            });
            if let Err(err) = configured {
                ffi::TFE_DeleteContextOptions(options);
                return Err(err);
            }
            ffi::TFE_ContextOptionsSetAsync(options, 0);
            ffi::TFE_ContextOptionsSetDevicePlacementPolicy(options, ffi::DEVICE_PLACEMENT_SILENT);
            let ctx = with_status(|s| ffi::TFE_NewContext(options, s));
            ffi::TFE_DeleteContextOptions(options);
            let ctx = ctx?;
            NonNull::new(ctx)
                .map(EagerContext)
                .ok_or_else(|| TfError::new(13, "TFE_NewContext returned no context"))
        }
    }

    pub(super) fn as_ptr(&self) -> *mut ffi::TFE_Context {
        self.0.as_ptr()
    }

    /// Registers a serialized FunctionDef (TensorFlow validates it).
    pub fn add_function(&self, function_def: &[u8]) -> Result<(), TfError> {
        // SAFETY: the context is live; TF copies the bytes.
        with_status(|s| unsafe {
            ffi::TFE_ContextAddFunctionDef(
                self.as_ptr(),
                function_def.as_ptr().cast(),
                function_def.len(),
                s,
            )
        })
    }

    pub fn remove_function(&self, name: &str) -> Result<(), TfError> {
        let name = c_string("function name", name)?;
        // SAFETY: the context is live and the name NUL-terminated.
        with_status(|s| unsafe { ffi::TFE_ContextRemoveFunction(self.as_ptr(), name.as_ptr(), s) })
    }

    pub fn has_function(&self, name: &str) -> bool {
        match CString::new(name) {
            // SAFETY: the context is live and the name NUL-terminated.
            Ok(name) => unsafe { ffi::TFE_ContextHasFunction(self.as_ptr(), name.as_ptr()) != 0 },
            Err(_) => false,
        }
    }

    /// Runs one op or registered function and returns its outputs.
    ///
    /// `attrs` are serialized AttrValue protos; `device` is a device of this
    /// context (empty: TensorFlow places the op).
    pub fn execute(
        &self,
        name: &str,
        device: &str,
        inputs: &[&TensorHandle],
        attrs: &[(&str, &[u8])],
        slots: &mut OutputSlots,
    ) -> Result<Vec<TensorHandle>, TfError> {
        let name_c = c_string("op name", name)?;
        // SAFETY: the context is live; the op is deleted by the guard below.
        let op = with_status(|s| unsafe { ffi::TFE_NewOp(self.as_ptr(), name_c.as_ptr(), s) })?;
        let op = OpGuard(op);
        if !device.is_empty() {
            let device = c_string("device", device)?;
            // SAFETY: op is live, the name NUL-terminated.
            with_status(|s| unsafe { ffi::TFE_OpSetDevice(op.0, device.as_ptr(), s) })?;
        }
        for input in inputs {
            // SAFETY: op and the handle are live; TF takes its own reference.
            with_status(|s| unsafe { ffi::TFE_OpAddInput(op.0, input.as_ptr(), s) })?;
        }
        for (attr, value) in attrs {
            let attr = c_string("attribute name", attr)?;
            // SAFETY: op is live; TF parses and copies the proto bytes.
            with_status(|s| unsafe {
                ffi::TFE_OpSetAttrValueProto(
                    op.0,
                    attr.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    s,
                )
            })?;
        }
        let retvals = &mut slots.0;
        let mut count = retvals.len() as c_int;
        // SAFETY: retvals holds `count` slots; TF fills the first `count` on success.
        with_status(|s| unsafe { ffi::TFE_Execute(op.0, retvals.as_mut_ptr(), &mut count, s) })?;
        let count = (count.max(0) as usize).min(retvals.len());
        Ok(retvals[..count]
            .iter_mut()
            // SAFETY: each returned handle is new and owned by the caller; the
            // slot is cleared so it is taken once.
            .filter_map(|h| unsafe {
                TensorHandle::from_raw(std::mem::replace(h, std::ptr::null_mut()))
            })
            .collect())
    }
}

impl Drop for EagerContext {
    fn drop(&mut self) {
        // SAFETY: self owns the context; its handles were dropped before it.
        unsafe { ffi::TFE_DeleteContext(self.as_ptr()) }
    }
}

struct OpGuard(*mut ffi::TFE_Op);

impl Drop for OpGuard {
    fn drop(&mut self) {
        // SAFETY: the op came from TFE_NewOp and is deleted once.
        unsafe { ffi::TFE_DeleteOp(self.0) }
    }
}

/// An owned `TFE_TensorHandle`.
pub struct TensorHandle(NonNull<ffi::TFE_TensorHandle>);

// SAFETY: handles are reference counted inside TensorFlow and carry no thread
// affinity; the runtime uses them from its context's thread.
unsafe impl Send for TensorHandle {}
unsafe impl Sync for TensorHandle {}

impl TensorHandle {
    /// # Safety
    /// `ptr` must be a handle owned by nobody else (or null).
    unsafe fn from_raw(ptr: *mut ffi::TFE_TensorHandle) -> Option<TensorHandle> {
        NonNull::new(ptr).map(TensorHandle)
    }

    fn as_ptr(&self) -> *mut ffi::TFE_TensorHandle {
        self.0.as_ptr()
    }

    /// A handle on the host CPU holding `tensor` (TensorFlow shares its buffer).
    pub fn from_tensor(tensor: &Tensor) -> Result<TensorHandle, TfError> {
        // SAFETY: the tensor is live; TF takes its own reference to the buffer.
        let h = with_status(|s| unsafe { ffi::TFE_NewTensorHandle(tensor.as_ptr(), s) })?;
        // SAFETY: the new handle is owned by the caller.
        unsafe { TensorHandle::from_raw(h) }
            .ok_or_else(|| TfError::new(13, "TFE_NewTensorHandle returned no handle"))
    }

    /// The dtype number (`DT_*`), including resource and variant.
    pub fn dtype_raw(&self) -> i32 {
        // SAFETY: the handle is live.
        unsafe { ffi::TFE_TensorHandleDataTypeRaw(self.as_ptr()) }
    }

    /// The shape; waits for the op producing it in an async context.
    pub fn dims(&self) -> Result<Vec<i64>, TfError> {
        // SAFETY: the handle is live.
        let rank = with_status(|s| unsafe { ffi::TFE_TensorHandleNumDims(self.as_ptr(), s) })?;
        (0..rank)
            // SAFETY: i < rank.
            .map(|i| with_status(|s| unsafe { ffi::TFE_TensorHandleDim(self.as_ptr(), i, s) }))
            .collect()
    }

    /// The device of the op that produced this handle.
    pub fn device_name(&self) -> Result<String, TfError> {
        // SAFETY: the returned string belongs to the handle and is copied at once.
        let name = with_status(|s| unsafe { ffi::TFE_TensorHandleDeviceName(self.as_ptr(), s) })?;
        if name.is_null() {
            return Ok(String::new());
        }
        // SAFETY: non-null, NUL-terminated, owned by the live handle.
        Ok(unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned())
    }

    /// The value, copied to host memory if it lives on a device.
    pub fn resolve(&self) -> Result<Tensor, TfError> {
        // SAFETY: the handle is live; the returned tensor is owned by the caller.
        let t = with_status(|s| unsafe { ffi::TFE_TensorHandleResolve(self.as_ptr(), s) })?;
        // SAFETY: t is a new tensor owned by nobody else.
        unsafe { Tensor::from_raw(t) }
            .ok_or_else(|| TfError::new(13, "TFE_TensorHandleResolve returned no tensor"))
    }

    /// A copy of this handle's value on `device` of `ctx`.
    pub fn copy_to_device(
        &self,
        ctx: &EagerContext,
        device: &str,
    ) -> Result<TensorHandle, TfError> {
        let device = c_string("device", device)?;
        // SAFETY: handle and context are live; the new handle is owned by the caller.
        let h = with_status(|s| unsafe {
            ffi::TFE_TensorHandleCopyToDevice(self.as_ptr(), ctx.as_ptr(), device.as_ptr(), s)
        })?;
        // SAFETY: as above.
        unsafe { TensorHandle::from_raw(h) }
            .ok_or_else(|| TfError::new(13, "TFE_TensorHandleCopyToDevice returned no handle"))
    }
}

impl Drop for TensorHandle {
    fn drop(&mut self) {
        // SAFETY: self owns one reference to the handle and releases it once.
        unsafe { ffi::TFE_DeleteTensorHandle(self.as_ptr()) }
    }
}
