//! TensorFlow's C API as far as the shim uses it, reached at run time.
//!
//! The shim does not link libtensorflow: it defines some TF_* functions itself and finds
//! TensorFlow's in the process. A program built against the wheel refers to
//! `TF_NewSession@tensorflow`; the dynamic linker binds such a versioned reference to the
//! preloaded shim's unversioned definition (glibc accepts a definition without a version
//! for any requested version), so the shim needs no version script of its own. `dlvsym(RTLD_NEXT, name, "tensorflow")` gives the
//! definition after the shim's own (libtensorflow_cc.so.2 exports them as
//! `TF_NewSession@@tensorflow`; unversioned builds such as libtensorflow.so.2 are found by
//! plain `dlsym`). A program that `dlopen`s TensorFlow privately (RTLD_LOCAL, as JNI does)
//! keeps it out of RTLD_NEXT's reach, so the known library names are tried next.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

// Opaque TensorFlow types.
#[repr(C)]
pub struct TF_Status {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_SessionOptions {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_Session {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_Graph {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_Operation {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_OperationDescription {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_Tensor {
    _private: [u8; 0],
}
#[repr(C)]
pub struct TF_Function {
    _private: [u8; 0],
}

#[repr(C)]
pub struct TF_Buffer {
    pub data: *const c_void,
    pub length: usize,
    pub data_deallocator: Option<unsafe extern "C" fn(*mut c_void, usize)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct TF_Output {
    pub oper: *mut TF_Operation,
    pub index: c_int,
}

/// TF_Code values the shim reports.
pub const TF_OK: c_int = 0;
pub const TF_INVALID_ARGUMENT: c_int = 3;
pub const TF_FAILED_PRECONDITION: c_int = 9;
pub const TF_INTERNAL: c_int = 13;
pub const TF_UNAVAILABLE: c_int = 14;

/// The version node of TensorFlow's exported C API symbols in the wheel's libraries.
const TF_SYMBOL_VERSION: &CStr = c"tensorflow";
/// Where a privately loaded TensorFlow may live (already loaded; never loaded by the shim).
const TF_LIBRARIES: [&CStr; 3] = [
    c"libtensorflow_cc.so.2",
    c"libtensorflow.so.2",
    c"libtensorflow_framework.so.2",
];

/// The address of TensorFlow's own `name`, or null if it is not in the process.
fn find(name: &CStr) -> *mut c_void {
    // SAFETY: dlvsym/dlsym/dlopen take NUL-terminated strings and only read them.
    unsafe {
        let versioned = libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), TF_SYMBOL_VERSION.as_ptr());
        if !versioned.is_null() {
            return versioned;
        }
        let plain = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
        if !plain.is_null() {
            return plain;
        }
        for lib in TF_LIBRARIES {
            let handle = libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if handle.is_null() {
                continue;
            }
            let mut sym = libc::dlvsym(handle, name.as_ptr(), TF_SYMBOL_VERSION.as_ptr());
            if sym.is_null() {
                sym = libc::dlsym(handle, name.as_ptr());
            }
            libc::dlclose(handle); // NOLOAD took a reference of its own
            if !sym.is_null() {
                return sym;
            }
        }
        std::ptr::null_mut()
    }
}

/// A TensorFlow function that is not in the process (the shim preloaded into a program
/// that never loaded TensorFlow, or an older TensorFlow without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missing(pub &'static str);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorFlow's {} was not found in this process", self.0)
    }
}

macro_rules! tf_functions {
    ($( $name:ident : fn($($arg:ty),*) $(-> $ret:ty)? ;)*) => {
        /// TensorFlow's own C API functions, resolved once each.
        #[allow(non_snake_case)]
        pub mod real {
            use super::*;
            $(
                #[allow(non_snake_case)]
                pub fn $name() -> Result<unsafe extern "C" fn($($arg),*) $(-> $ret)?, Missing> {
                    static CELL: OnceLock<usize> = OnceLock::new();
                    let addr = *CELL.get_or_init(|| {
                        let name = CString::new(stringify!($name)).expect("no NUL in a TF name");
                        find(&name) as usize
                    });
                    if addr == 0 {
                        return Err(Missing(stringify!($name)));
                    }
                    // SAFETY: the symbol of this name in TensorFlow's C API has this signature
                    // (tensorflow/c/c_api.h).
                    Ok(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(addr) })
                }
            )*
        }
    };
}

tf_functions! {
    TF_NewSessionOptions: fn() -> *mut TF_SessionOptions;
    TF_DeleteSessionOptions: fn(*mut TF_SessionOptions);
    TF_SetTarget: fn(*mut TF_SessionOptions, *const c_char);
    TF_SetConfig: fn(*mut TF_SessionOptions, *const c_void, usize, *mut TF_Status);
    TF_NewSession: fn(*mut TF_Graph, *const TF_SessionOptions, *mut TF_Status) -> *mut TF_Session;
    TF_LoadSessionFromSavedModel: fn(*const TF_SessionOptions, *const TF_Buffer, *const c_char,
        *const *const c_char, c_int, *mut TF_Graph, *mut TF_Buffer, *mut TF_Status) -> *mut TF_Session;
    TF_CloseSession: fn(*mut TF_Session, *mut TF_Status);
    TF_DeleteSession: fn(*mut TF_Session, *mut TF_Status);
    TF_SessionRun: fn(*mut TF_Session, *const TF_Buffer, *const TF_Output, *const *mut TF_Tensor, c_int,
        *const TF_Output, *mut *mut TF_Tensor, c_int, *const *const TF_Operation, c_int, *mut TF_Buffer,
        *mut TF_Status);
    TF_NewStatus: fn() -> *mut TF_Status;
    TF_DeleteStatus: fn(*mut TF_Status);
    TF_SetStatus: fn(*mut TF_Status, c_int, *const c_char);
    TF_GetCode: fn(*const TF_Status) -> c_int;
    TF_Message: fn(*const TF_Status) -> *const c_char;
    TF_GraphNextOperation: fn(*mut TF_Graph, *mut usize) -> *mut TF_Operation;
    TF_GraphOperationByName: fn(*mut TF_Graph, *const c_char) -> *mut TF_Operation;
    TF_OperationOpType: fn(*mut TF_Operation) -> *const c_char;
    TF_OperationName: fn(*mut TF_Operation) -> *const c_char;
    TF_OperationGetAttrType: fn(*mut TF_Operation, *const c_char, *mut c_int, *mut TF_Status);
    TF_NewOperation: fn(*mut TF_Graph, *const c_char, *const c_char) -> *mut TF_OperationDescription;
    TF_AddInput: fn(*mut TF_OperationDescription, TF_Output);
    TF_SetAttrType: fn(*mut TF_OperationDescription, *const c_char, c_int);
    TF_FinishOperation: fn(*mut TF_OperationDescription, *mut TF_Status) -> *mut TF_Operation;
    TF_DeleteTensor: fn(*mut TF_Tensor);
    TF_TensorByteSize: fn(*const TF_Tensor) -> usize;
    TF_NewBuffer: fn() -> *mut TF_Buffer;
    TF_DeleteBuffer: fn(*mut TF_Buffer);
    TF_GraphNumFunctions: fn(*mut TF_Graph) -> c_int;
    TF_GraphGetFunctions: fn(*mut TF_Graph, *mut *mut TF_Function, c_int, *mut TF_Status) -> c_int;
    TF_FunctionToFunctionDef: fn(*mut TF_Function, *mut TF_Buffer, *mut TF_Status);
    TF_FunctionName: fn(*mut TF_Function) -> *const c_char;
    TF_DeleteFunction: fn(*mut TF_Function);
    TF_GraphRemoveFunction: fn(*mut TF_Graph, *const c_char, *mut TF_Status);
    TF_FunctionImportFunctionDef: fn(*const c_void, usize, *mut TF_Status) -> *mut TF_Function;
    TF_GraphCopyFunction: fn(*mut TF_Graph, *const TF_Function, *const TF_Function, *mut TF_Status);
}

/// Sets `status` (when the caller gave one) to `code` and `message`.
pub fn set_status(status: *mut TF_Status, code: c_int, message: &str) {
    if status.is_null() {
        return;
    }
    if let Ok(set) = real::TF_SetStatus() {
        let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: status is the caller's live TF_Status; TF copies the message.
        unsafe { set(status, code, text.as_ptr()) };
    }
}

/// A TF_Status the shim owns for its own calls into TensorFlow; deleted on drop.
pub struct OwnedStatus(*mut TF_Status);

impl OwnedStatus {
    pub fn new() -> Result<Self, Missing> {
        // SAFETY: TF_NewStatus has no preconditions.
        let ptr = unsafe { real::TF_NewStatus()?() };
        Ok(OwnedStatus(ptr))
    }

    pub fn ptr(&self) -> *mut TF_Status {
        self.0
    }

    /// `Err((code, message))` when the last call failed.
    pub fn check(&self) -> Result<(), (c_int, String)> {
        status_result(self.0)
    }
}

impl Drop for OwnedStatus {
    fn drop(&mut self) {
        if let Ok(delete) = real::TF_DeleteStatus() {
            // SAFETY: self.0 came from TF_NewStatus and is deleted once.
            unsafe { delete(self.0) };
        }
    }
}

/// The code and message of a status (any caller's); `Ok` for TF_OK.
pub fn status_result(status: *const TF_Status) -> Result<(), (c_int, String)> {
    if status.is_null() {
        return Ok(());
    }
    let (Ok(get_code), Ok(message)) = (real::TF_GetCode(), real::TF_Message()) else {
        return Ok(());
    };
    // SAFETY: status is a live TF_Status; TF_Message returns a NUL-terminated string it owns.
    unsafe {
        let code = get_code(status);
        if code == TF_OK {
            return Ok(());
        }
        let text = message(status);
        let text = if text.is_null() {
            String::new()
        } else {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        };
        Err((code, text))
    }
}
