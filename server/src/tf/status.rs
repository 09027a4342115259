//! TF_Status wrapper and the error type every TensorFlow call returns.

use std::ffi::CStr;

use tensorflow_sys as sys;

pub use salus_node::tf_types::TfError;

/// Owned `TF_Status`.
pub struct Status(*mut sys::TF_Status);

impl Status {
    pub fn new() -> Self {
        // SAFETY: TF_NewStatus has no preconditions and never returns null.
        Status(unsafe { sys::TF_NewStatus() })
    }

    pub fn as_ptr(&self) -> *mut sys::TF_Status {
        self.0
    }

    /// Ok(()) when the last call succeeded, else TensorFlow's code and message.
    pub fn check(&self) -> Result<(), TfError> {
        // SAFETY: self.0 is a live status owned by self.
        let code = unsafe { sys::TF_GetCode(self.0) } as i32;
        if code == 0 {
            return Ok(());
        }
        // SAFETY: TF_Message returns a NUL-terminated string owned by the status,
        // valid until the status is modified; it is copied at once.
        let message = unsafe { CStr::from_ptr(sys::TF_Message(self.0)) }
            .to_string_lossy()
            .into_owned();
        Err(TfError { code, message })
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: self.0 came from TF_NewStatus and is deleted once.
        unsafe { sys::TF_DeleteStatus(self.0) }
    }
}

/// Runs `f` with a fresh status and converts the outcome.
pub fn with_status<T>(f: impl FnOnce(*mut sys::TF_Status) -> T) -> Result<T, TfError> {
    let status = Status::new();
    let value = f(status.as_ptr());
    status.check().map(|()| value)
}
