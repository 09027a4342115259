//! C API functions the 2.21 wheel exports that tensorflow-sys 0.24 does not bind.

use tensorflow_sys::{TF_Buffer, TF_ImportGraphDefOptions, TF_Status, TF_Tensor};

extern "C" {
    /// Parses a serialized TensorProto into `to` with TensorFlow's own rules
    /// (typed `*_val` fields, "one value fills the whole shape"). Declared in c_api.h.
    pub fn TF_TensorFromProto(from: *const TF_Buffer, to: *mut TF_Tensor, status: *mut TF_Status);

    /// Declared in c_api_experimental.h. Deltas from ExtendSession colocate new
    /// nodes with nodes imported earlier; TF's default check only looks inside
    /// the delta and would reject them.
    pub fn TF_ImportGraphDefOptionsSetValidateColocationConstraints(
        opts: *mut TF_ImportGraphDefOptions,
        enable: u8,
    );
}

#[allow(clashing_extern_declarations)]
extern "C" {
    /// `TF_TensorType` returning the raw number: tensorflow-sys returns a Rust enum
    /// that lacks newer dtypes (float8, int4), and an unknown value there would be
    /// undefined behaviour.
    #[link_name = "TF_TensorType"]
    pub fn TF_TensorTypeRaw(tensor: *const TF_Tensor) -> i32;
}

#[allow(clashing_extern_declarations)]
extern "C" {
    /// `TF_OperationOutputType` returning the raw dtype number (see TF_TensorTypeRaw).
    #[link_name = "TF_OperationOutputType"]
    pub fn TF_OperationOutputTypeRaw(output: tensorflow_sys::TF_Output) -> i32;
}

/// The eager C API (`tensorflow/c/eager/c_api.h` and `c_api_experimental.h`),
/// exported by `libtensorflow_cc.so.2`. Declared here rather than through
/// tensorflow-sys's `eager` feature: only these functions are used, and
/// `TFE_OpSetAttrValueProto` (experimental) is not bound there at all.
pub mod eager {
    use std::ffi::{c_char, c_int, c_uchar, c_void};

    use tensorflow_sys::{TF_Status, TF_Tensor};

    #[repr(C)]
    pub struct TFE_ContextOptions {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TFE_Context {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TFE_Op {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TFE_TensorHandle {
        _private: [u8; 0],
    }

    /// `TFE_DEVICE_PLACEMENT_SILENT`: inputs are copied to the op's device
    /// without a warning, as TensorFlow's own eager worker does.
    pub const DEVICE_PLACEMENT_SILENT: c_int = 2;

    extern "C" {
        pub fn TFE_NewContextOptions() -> *mut TFE_ContextOptions;
        pub fn TFE_ContextOptionsSetConfig(
            options: *mut TFE_ContextOptions,
            proto: *const c_void,
            proto_len: usize,
            status: *mut TF_Status,
        );
        pub fn TFE_ContextOptionsSetAsync(options: *mut TFE_ContextOptions, enable: c_uchar);
        pub fn TFE_ContextOptionsSetDevicePlacementPolicy(
            options: *mut TFE_ContextOptions,
            policy: c_int,
        );
        pub fn TFE_DeleteContextOptions(options: *mut TFE_ContextOptions);

        pub fn TFE_NewContext(
            opts: *const TFE_ContextOptions,
            status: *mut TF_Status,
        ) -> *mut TFE_Context;
        pub fn TFE_DeleteContext(ctx: *mut TFE_Context);
        pub fn TFE_ContextAddFunctionDef(
            ctx: *mut TFE_Context,
            serialized_function_def: *const c_char,
            size: usize,
            status: *mut TF_Status,
        );
        pub fn TFE_ContextRemoveFunction(
            ctx: *mut TFE_Context,
            name: *const c_char,
            status: *mut TF_Status,
        );
        pub fn TFE_ContextHasFunction(ctx: *mut TFE_Context, name: *const c_char) -> c_uchar;

        pub fn TFE_NewTensorHandle(
            t: *const TF_Tensor,
            status: *mut TF_Status,
        ) -> *mut TFE_TensorHandle;
        pub fn TFE_DeleteTensorHandle(h: *mut TFE_TensorHandle);
        #[link_name = "TFE_TensorHandleDataType"]
        pub fn TFE_TensorHandleDataTypeRaw(h: *mut TFE_TensorHandle) -> c_int;
        pub fn TFE_TensorHandleNumDims(h: *mut TFE_TensorHandle, status: *mut TF_Status) -> c_int;
        pub fn TFE_TensorHandleDim(
            h: *mut TFE_TensorHandle,
            dim_index: c_int,
            status: *mut TF_Status,
        ) -> i64;
        pub fn TFE_TensorHandleDeviceName(
            h: *mut TFE_TensorHandle,
            status: *mut TF_Status,
        ) -> *const c_char;
        pub fn TFE_TensorHandleResolve(
            h: *mut TFE_TensorHandle,
            status: *mut TF_Status,
        ) -> *mut TF_Tensor;
        pub fn TFE_TensorHandleCopyToDevice(
            h: *mut TFE_TensorHandle,
            ctx: *mut TFE_Context,
            device_name: *const c_char,
            status: *mut TF_Status,
        ) -> *mut TFE_TensorHandle;

        pub fn TFE_NewOp(
            ctx: *mut TFE_Context,
            op_or_function_name: *const c_char,
            status: *mut TF_Status,
        ) -> *mut TFE_Op;
        pub fn TFE_DeleteOp(op: *mut TFE_Op);
        pub fn TFE_OpSetDevice(op: *mut TFE_Op, device_name: *const c_char, status: *mut TF_Status);
        pub fn TFE_OpAddInput(
            op: *mut TFE_Op,
            input: *mut TFE_TensorHandle,
            status: *mut TF_Status,
        );
        pub fn TFE_OpSetAttrValueProto(
            op: *const TFE_Op,
            attr_name: *const c_char,
            proto: *const c_void,
            proto_len: usize,
            status: *mut TF_Status,
        );
        pub fn TFE_Execute(
            op: *mut TFE_Op,
            retvals: *mut *mut TFE_TensorHandle,
            num_retvals: *mut c_int,
            status: *mut TF_Status,
        );
    }
}

/// The kernel C API (`tensorflow/c/kernels.h`), exported by
/// `libtensorflow_framework.so.2`: the server's own kernels for ops whose
/// TensorFlow kernels live in TensorFlow's Python extension (see
/// `tf::python_kernel`).
pub mod kernels {
    use std::ffi::{c_char, c_int, c_void};

    use tensorflow_sys::{TF_Status, TF_Tensor};

    #[repr(C)]
    pub struct TF_KernelBuilder {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TF_OpKernelConstruction {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TF_OpKernelContext {
        _private: [u8; 0],
    }
    #[repr(C)]
    pub struct TF_StringView {
        pub data: *const c_char,
        pub len: usize,
    }

    pub type CreateFn = unsafe extern "C" fn(*mut TF_OpKernelConstruction) -> *mut c_void;
    pub type ComputeFn = unsafe extern "C" fn(*mut c_void, *mut TF_OpKernelContext);
    pub type DeleteFn = unsafe extern "C" fn(*mut c_void);

    extern "C" {
        pub fn TF_NewKernelBuilder(
            op_name: *const c_char,
            device_name: *const c_char,
            create_func: Option<CreateFn>,
            compute_func: Option<ComputeFn>,
            delete_func: Option<DeleteFn>,
        ) -> *mut TF_KernelBuilder;
        pub fn TF_RegisterKernelBuilder(
            kernel_name: *const c_char,
            builder: *mut TF_KernelBuilder,
            status: *mut TF_Status,
        );
        pub fn TF_OpKernelConstruction_GetAttrSize(
            ctx: *mut TF_OpKernelConstruction,
            attr_name: *const c_char,
            list_size: *mut i32,
            total_size: *mut i32,
            status: *mut TF_Status,
        );
        pub fn TF_OpKernelConstruction_GetAttrString(
            ctx: *mut TF_OpKernelConstruction,
            attr_name: *const c_char,
            value: *mut c_char,
            max_length: usize,
            status: *mut TF_Status,
        );
        pub fn TF_OpKernelConstruction_GetName(ctx: *mut TF_OpKernelConstruction) -> TF_StringView;
        pub fn TF_OpKernelConstruction_Failure(
            ctx: *mut TF_OpKernelConstruction,
            status: *mut TF_Status,
        );
        pub fn TF_NumInputs(ctx: *mut TF_OpKernelContext) -> c_int;
        pub fn TF_NumOutputs(ctx: *mut TF_OpKernelContext) -> c_int;
        pub fn TF_GetInput(
            ctx: *mut TF_OpKernelContext,
            i: c_int,
            tensor: *mut *mut TF_Tensor,
            status: *mut TF_Status,
        );
        pub fn TF_SetOutput(
            ctx: *mut TF_OpKernelContext,
            i: c_int,
            tensor: *const TF_Tensor,
            status: *mut TF_Status,
        );
        /// The dtype number of output `i` (TF_DataType).
        pub fn TF_ExpectedOutputDataType(ctx: *mut TF_OpKernelContext, i: c_int) -> c_int;
        pub fn TF_OpKernelContext_Failure(ctx: *mut TF_OpKernelContext, status: *mut TF_Status);
    }
}

#[allow(clashing_extern_declarations)]
extern "C" {
    /// `TF_SetStatus` taking the raw code number (tensorflow-sys's `TF_Code`
    /// is a Rust enum: a number from a client must not be transmuted into it).
    #[link_name = "TF_SetStatus"]
    pub fn TF_SetStatusRaw(status: *mut TF_Status, code: i32, message: *const std::ffi::c_char);
}
