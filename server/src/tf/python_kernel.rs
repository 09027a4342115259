//! The server's CPU kernels for the ops that call Python (PyFunc,
//! PyFuncStateless, EagerPyFunc). TensorFlow's own kernels for them live in
//! its Python extension, which the server does not load; these hand the op's
//! inputs to the script that built it and wait for its outputs, through the
//! [`PythonCall`] the server installs them with (`runtime::python_calls`).

use std::ffi::{c_void, CString};
use std::sync::{Once, OnceLock};

use salus_proto::tensorflow::TensorProto;

use tensorflow_sys as sys;

use super::ffi::kernels as k;
use super::ffi::TF_SetStatusRaw;
use super::status::Status;
use super::{Tensor, TfError};

/// Hands an op's inputs to the Python of the script that built it (its
/// token names the script) and waits for the outputs or the Python's error.
pub type PythonCall = fn(
    token: &str,
    op: &str,
    node: &str,
    inputs: Vec<TensorProto>,
) -> Result<Vec<TensorProto>, TfError>;

static PYTHON_CALL: OnceLock<PythonCall> = OnceLock::new();

/// The most bytes one output the script returns may take (its proto is
/// bounded by the stream's message size; one value can fill a large shape).
static MAX_OUTPUT_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 32);

struct Kernel {
    op: &'static str,
    node: String,
    token: String,
}

/// Registers the kernels once per process, calling Python through `call`
/// (the first one given); `max_output_bytes` bounds one output. Errors are
/// logged: without them such ops fail with TensorFlow's "no kernel" error.
pub fn install(max_output_bytes: u64, call: PythonCall) {
    MAX_OUTPUT_BYTES.store(max_output_bytes, std::sync::atomic::Ordering::Relaxed);
    let _ = PYTHON_CALL.set(call);
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (op, create) in [
            ("PyFunc", create_py_func as k::CreateFn),
            ("PyFuncStateless", create_py_func_stateless as k::CreateFn),
            ("EagerPyFunc", create_eager_py_func as k::CreateFn),
        ] {
            let name = CString::new(op).expect("op names have no NUL");
            let status = Status::new();
            // SAFETY: valid C strings; the builder is consumed by the registration.
            unsafe {
                let builder = k::TF_NewKernelBuilder(
                    name.as_ptr(),
                    c"CPU".as_ptr(),
                    Some(create),
                    Some(compute),
                    Some(delete),
                );
                k::TF_RegisterKernelBuilder(name.as_ptr(), builder, status.as_ptr());
            }
            if let Err(e) = status.check() {
                tracing::warn!(op, error = %e, "could not register the Python callback kernel");
            }
        }
    });
}

unsafe extern "C" fn create_py_func(ctx: *mut k::TF_OpKernelConstruction) -> *mut c_void {
    create_guarded("PyFunc", ctx)
}
unsafe extern "C" fn create_py_func_stateless(ctx: *mut k::TF_OpKernelConstruction) -> *mut c_void {
    create_guarded("PyFuncStateless", ctx)
}
unsafe extern "C" fn create_eager_py_func(ctx: *mut k::TF_OpKernelConstruction) -> *mut c_void {
    create_guarded("EagerPyFunc", ctx)
}

/// TensorFlow's INTERNAL code.
const INTERNAL: i32 = 13;

/// Runs `body`, the work of a function TensorFlow calls: a panic in it
/// becomes an INTERNAL error naming `what` instead of unwinding into
/// TensorFlow's C++ frames (which is undefined behaviour; Rust aborts the
/// process there), so the op fails and the server goes on.
pub(crate) fn guarded<T>(what: &str, body: impl FnOnce() -> Result<T, TfError>) -> Result<T, TfError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            tracing::error!(what, why, "a panic in a function TensorFlow called; the op fails");
            Err(TfError::new(
                INTERNAL,
                format!("{what}: internal error in the Salus server: {why} (please report it with the server's log)"),
            ))
        }
    }
}

/// `create` under [`guarded`]: a failure, panic included, fails the kernel's
/// construction.
unsafe fn create_guarded(op: &'static str, ctx: *mut k::TF_OpKernelConstruction) -> *mut c_void {
    match guarded(op, || create(op, ctx)) {
        Ok(kernel) => kernel,
        Err(e) => {
            // SAFETY: the construction context TensorFlow gave.
            if let Err(panic) = std::panic::catch_unwind(|| unsafe { fail_construction(ctx, &e) }) {
                drop(panic);
            }
            std::ptr::null_mut()
        }
    }
}

unsafe fn fail_construction(ctx: *mut k::TF_OpKernelConstruction, error: &TfError) {
    let status = status_of(error);
    k::TF_OpKernelConstruction_Failure(ctx, status.as_ptr());
}

/// Reads the node's name and `token` attribute.
unsafe fn create(op: &'static str, ctx: *mut k::TF_OpKernelConstruction) -> Result<*mut c_void, TfError> {
    let view = k::TF_OpKernelConstruction_GetName(ctx);
    let node = if view.data.is_null() {
        String::new()
    } else {
        String::from_utf8_lossy(std::slice::from_raw_parts(view.data.cast::<u8>(), view.len))
            .into_owned()
    };
    let status = Status::new();
    let (mut list_size, mut total_size) = (0i32, 0i32);
    k::TF_OpKernelConstruction_GetAttrSize(
        ctx,
        c"token".as_ptr(),
        &mut list_size,
        &mut total_size,
        status.as_ptr(),
    );
    let mut token = Vec::new();
    if status.check().is_ok() {
        token = vec![0u8; total_size.max(0) as usize + 1];
        k::TF_OpKernelConstruction_GetAttrString(
            ctx,
            c"token".as_ptr(),
            token.as_mut_ptr().cast(),
            token.len(),
            status.as_ptr(),
        );
        token.truncate(total_size.max(0) as usize);
    }
    status.check()?;
    let kernel = Kernel {
        op,
        node,
        token: String::from_utf8_lossy(&token).into_owned(),
    };
    Ok(Box::into_raw(Box::new(kernel)).cast())
}

unsafe extern "C" fn delete(kernel: *mut c_void) {
    if kernel.is_null() {
        return;
    }
    // A panic here (in a Drop) is logged by `guarded`; nothing to fail.
    let _ = guarded("deleting a Python callback kernel", || {
        // SAFETY: `kernel` is the Box that `create` leaked, deleted once.
        drop(unsafe { Box::from_raw(kernel.cast::<Kernel>()) });
        Ok(())
    });
}

unsafe extern "C" fn compute(kernel: *mut c_void, ctx: *mut k::TF_OpKernelContext) {
    let result = guarded("a Python callback op", || {
        // SAFETY: TensorFlow calls compute only with what `create` returned.
        let kernel = unsafe { kernel.cast::<Kernel>().as_ref() }
            .ok_or_else(|| TfError::new(INTERNAL, "a Python callback kernel without its state"))?;
        // SAFETY: the kernel context TensorFlow gave, for this call.
        unsafe { run(kernel, ctx) }
    });
    if let Err(e) = result {
        // SAFETY: as above; `fail` builds only a status and a C string.
        let _ = std::panic::catch_unwind(|| unsafe { fail(ctx, &e) });
    }
}

/// A TensorFlow status of `error`'s code (UNKNOWN for a code TensorFlow has
/// not) and message.
fn status_of(error: &TfError) -> Status {
    let code = if (1..=16).contains(&error.code) {
        error.code
    } else {
        2
    };
    let message = CString::new(error.message.replace('\0', " ")).unwrap_or_default();
    let status = Status::new();
    // SAFETY: a live status and a valid C string.
    unsafe { TF_SetStatusRaw(status.as_ptr(), code, message.as_ptr()) };
    status
}

unsafe fn fail(ctx: *mut k::TF_OpKernelContext, error: &TfError) {
    let status = status_of(error);
    k::TF_OpKernelContext_Failure(ctx, status.as_ptr());
}

unsafe fn run(kernel: &Kernel, ctx: *mut k::TF_OpKernelContext) -> Result<(), TfError> {
    let (op, node) = (kernel.op, kernel.node.as_str());
    let mut inputs = Vec::new();
    for i in 0..k::TF_NumInputs(ctx) {
        let status = Status::new();
        let mut raw: *mut sys::TF_Tensor = std::ptr::null_mut();
        k::TF_GetInput(ctx, i, &mut raw, status.as_ptr());
        status.check()?;
        let tensor = Tensor::from_raw(raw)
            .ok_or_else(|| unsendable_input(op, node, i as usize, "TensorFlow gave no tensor"))?;
        let proto = tensor
            .into_proto()
            .map_err(|e| unsendable_input(op, node, i as usize, &e.to_string()))?;
        inputs.push(proto);
    }
    let call = PYTHON_CALL.get().ok_or_else(|| {
        TfError::new(INTERNAL, "the Python callback kernels were registered without their call")
    })?;
    let outputs = call(&kernel.token, op, node, inputs)?;
    let expected = k::TF_NumOutputs(ctx);
    if outputs.len() != expected as usize {
        return Err(TfError::new(
            3,
            format!(
                "op {op} ({node}): the script's Python returned {} values; the op has {expected} outputs",
                outputs.len()
            ),
        ));
    }
    let max_bytes = MAX_OUTPUT_BYTES.load(std::sync::atomic::Ordering::Relaxed);
    for (i, proto) in outputs.iter().enumerate() {
        let tensor = Tensor::from_proto(proto, max_bytes).map_err(|e| {
            TfError::new(
                3,
                format!("op {op} ({node}): output {i} from the script's Python: {e}"),
            )
        })?;
        let want = k::TF_ExpectedOutputDataType(ctx, i as i32);
        if tensor.dtype_raw() != want {
            return Err(TfError::new(
                3,
                format!(
                    "op {op} ({node}): output {i} from the script's Python has dtype {}, the op declares {}",
                    dtype_name(tensor.dtype_raw()),
                    dtype_name(want)
                ),
            ));
        }
        let status = Status::new();
        k::TF_SetOutput(ctx, i as i32, tensor.as_ptr(), status.as_ptr());
        status.check()?;
    }
    Ok(())
}

fn dtype_name(raw: i32) -> &'static str {
    salus_proto::tensorflow::DataType::try_from(raw)
        .map(|d| d.as_str_name())
        .unwrap_or("unknown")
}

/// The error for an op input that cannot be handed to Python.
fn unsendable_input(op: &str, node: &str, index: usize, why: &str) -> TfError {
    TfError::new(
        3, // INVALID_ARGUMENT
        format!("op {op} ({node}): input {index} cannot be passed to the script's Python: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_under_the_guard_becomes_an_internal_error() {
        let err = guarded("an op", || -> Result<(), TfError> { panic!("index out of bounds") })
            .unwrap_err();
        assert_eq!(err.code, INTERNAL);
        assert!(err.message.contains("an op") && err.message.contains("index out of bounds"), "{}", err.message);
        let err = guarded("an op", || -> Result<(), TfError> {
            std::panic::panic_any(42u8)
        })
        .unwrap_err();
        assert_eq!(err.code, INTERNAL);
    }

    #[test]
    fn the_guard_passes_results_and_errors_through() {
        assert_eq!(guarded("an op", || Ok(7)).unwrap(), 7);
        let err = guarded("an op", || -> Result<(), TfError> { Err(TfError::new(3, "bad input")) })
            .unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (3, "bad input"));
    }

    #[test]
    fn a_status_keeps_the_code_and_message_of_an_error() {
        let status = status_of(&TfError::new(INTERNAL, "boom\0tail"));
        let err = status.check().unwrap_err();
        assert_eq!(err.code, INTERNAL);
        assert_eq!(err.message, "boom tail");
        assert_eq!(status_of(&TfError::new(99, "odd")).check().unwrap_err().code, 2);
    }
}
