//! Safe wrappers over TensorFlow's C API (tensorflow-sys plus a few extra
//! declarations). Every function here blocks; callers run them off the async
//! runtime.
//!
//! # Layout
//! - [`status`]: TF_Status and [`TfError`].
//! - [`tensor`]: TensorProto <-> TF_Tensor conversion with validation.
//! - [`graph`]: TF_Graph, GraphDef import with mappings to existing nodes.
//! - [`session`]: TF_Session runs, partial runs, devices.
//! - [`eager`]: TFE contexts, tensor handles, op and function execution.
//! - [`allocator`]: a device's allocator statistics (`allocator_stats.cc`, C++).
//! - [`op_registry`]: facts about registered ops (which declare no outputs).
//! - [`python_kernel`]: the server's kernels for the ops that call a script's Python.
//! - `buffer`, `ffi`: TF_Buffer helpers and the declarations tensorflow-sys lacks.

pub mod allocator;
mod buffer;
pub mod eager;
mod ffi;
pub mod graph;
pub mod op_registry;
pub mod python_kernel;
pub mod session;
pub mod status;
pub mod tensor;

pub use graph::{tensorflow_version, Attr, Graph, ImportMappings, OpInput, Operation};
pub use session::{DeviceInfo, PartialRunHandle, RunOutput, Session};
pub use status::TfError;
pub use tensor::{Tensor, TensorError};
