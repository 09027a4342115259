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
