//! TF_Buffer helpers.

use std::ffi::c_void;

use tensorflow_sys as sys;

/// A TF_Buffer that borrows `bytes` for the duration of one C call.
pub fn borrowed(bytes: &[u8]) -> sys::TF_Buffer {
    sys::TF_Buffer {
        data: bytes.as_ptr() as *const c_void,
        length: bytes.len(),
        data_deallocator: None,
    }
}

/// A TF_Buffer that TensorFlow fills (run metadata); freed on drop.
pub struct OutputBuffer(*mut sys::TF_Buffer);

impl OutputBuffer {
    pub fn new() -> Self {
        // SAFETY: TF_NewBuffer has no preconditions.
        OutputBuffer(unsafe { sys::TF_NewBuffer() })
    }

    /// Takes ownership of a buffer TensorFlow returned (null: none).
    pub fn from_raw(buffer: *mut sys::TF_Buffer) -> Option<Self> {
        (!buffer.is_null()).then_some(OutputBuffer(buffer))
    }

    pub fn as_ptr(&self) -> *mut sys::TF_Buffer {
        self.0
    }

    pub fn to_vec(&self) -> Vec<u8> {
        // SAFETY: the buffer is live; data/length describe bytes TF wrote into it.
        unsafe {
            let b = &*self.0;
            if b.data.is_null() || b.length == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(b.data as *const u8, b.length).to_vec()
            }
        }
    }
}

impl Default for OutputBuffer {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OutputBuffer {
    fn drop(&mut self) {
        // SAFETY: created by TF_NewBuffer, deleted once.
        unsafe { sys::TF_DeleteBuffer(self.0) }
    }
}
