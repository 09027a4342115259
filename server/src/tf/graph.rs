//! TF_Graph wrapper: import of (delta) GraphDefs and name lookups.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use tensorflow_sys as sys;

use super::buffer;
use super::ffi;
use super::status::{with_status, TfError};
use super::tensor::Tensor;

/// An operation of a [`Graph`]; valid as long as the graph lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation(NonNull<sys::TF_Operation>);

// SAFETY: operations are immutable once added and owned by their graph, which is
// kept alive (Arc) by everyone holding one of its operations.
unsafe impl Send for Operation {}
unsafe impl Sync for Operation {}

impl Operation {
    pub fn as_ptr(self) -> *mut sys::TF_Operation {
        self.0.as_ptr()
    }

    pub fn num_outputs(self) -> i32 {
        // SAFETY: a live operation of a live graph.
        unsafe { sys::TF_OperationNumOutputs(self.as_ptr()) }
    }

    pub fn output(self, index: i32) -> sys::TF_Output {
        sys::TF_Output {
            oper: self.as_ptr(),
            index,
        }
    }

    /// The tensor feeding input `index` (must be < the op's input count).
    pub fn input_source(self, index: i32) -> sys::TF_Output {
        // SAFETY: a live operation; the caller keeps index in range.
        unsafe {
            sys::TF_OperationInput(sys::TF_Input {
                oper: self.as_ptr(),
                index,
            })
        }
    }

    /// The device the node asks for ("" when unplaced).
    pub fn device(self) -> String {
        // SAFETY: a live operation; TF returns a NUL-terminated string it owns.
        unsafe { CStr::from_ptr(sys::TF_OperationDevice(self.as_ptr())) }
            .to_string_lossy()
            .into_owned()
    }

    /// Raw dtype number of output `index` (must be < num_outputs).
    pub fn output_type_raw(self, index: i32) -> i32 {
        // SAFETY: a live operation; the caller keeps index in range.
        unsafe { ffi::TF_OperationOutputTypeRaw(self.output(index)) }
    }
}

/// An attribute value for [`Graph::add_operation`].
pub enum Attr<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Type(sys::TF_DataType),
    Tensor(&'a Tensor),
}

/// An input of an operation being added: one tensor or a list.
pub enum OpInput {
    One(sys::TF_Output),
    List(Vec<sys::TF_Output>),
}

/// How an imported delta's references to existing nodes are resolved.
#[derive(Default, Debug)]
pub struct ImportMappings {
    /// `name:index` in the delta → that output of an existing operation.
    pub data: Vec<(String, i32, Operation)>,
    /// `^name` in the delta → an existing operation.
    pub control: Vec<(String, Operation)>,
}

/// An owned TF_Graph. TensorFlow guards it with its own mutex, so it is shared
/// between request threads.
pub struct Graph(NonNull<sys::TF_Graph>);

// SAFETY: every TF_Graph function takes the graph's internal mutex.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Graph {
    pub fn new() -> Graph {
        // SAFETY: TF_NewGraph has no preconditions.
        Graph(NonNull::new(unsafe { sys::TF_NewGraph() }).expect("TF_NewGraph returned null"))
    }

    pub fn as_ptr(&self) -> *mut sys::TF_Graph {
        self.0.as_ptr()
    }

    /// The operation called `name`, if any. Names with NUL bytes match nothing.
    pub fn operation(&self, name: &str) -> Option<Operation> {
        let name = CString::new(name).ok()?;
        // SAFETY: live graph, NUL-terminated name.
        NonNull::new(unsafe { sys::TF_GraphOperationByName(self.as_ptr(), name.as_ptr()) })
            .map(Operation)
    }

    /// Imports `graph_def` (serialized GraphDef bytes) into this graph, wiring
    /// references to existing nodes through `mappings`; nodes without a device
    /// get `default_device`, if given.
    pub fn import(
        &self,
        graph_def: &[u8],
        mappings: &ImportMappings,
        default_device: Option<&str>,
    ) -> Result<(), TfError> {
        let default_device = default_device
            .map(|d| {
                CString::new(d).map_err(|_| TfError::new(3, format!("device {d:?} contains NUL")))
            })
            .transpose()?;
        // Keep the CStrings alive until the import is done: TF copies them, but
        // only during the call.
        let names: Vec<CString> = mappings
            .data
            .iter()
            .map(|(n, _, _)| n)
            .chain(mappings.control.iter().map(|(n, _)| n))
            .map(|n| {
                CString::new(n.as_str())
                    .map_err(|_| TfError::new(3, format!("node name {n:?} contains NUL")))
            })
            .collect::<Result<_, _>>()?;
        let graph_def = buffer::borrowed(graph_def);
        // SAFETY: options are created, used and deleted here; every pointer handed
        // to TF (names, operations, the borrowed buffer) outlives the calls.
        unsafe {
            let opts = sys::TF_NewImportGraphDefOptions();
            ffi::TF_ImportGraphDefOptionsSetValidateColocationConstraints(opts, 0);
            if let Some(device) = &default_device {
                sys::TF_ImportGraphDefOptionsSetDefaultDevice(opts, device.as_ptr());
            }
            let (data_names, control_names) = names.split_at(mappings.data.len());
            for ((_, index, op), name) in mappings.data.iter().zip(data_names) {
                sys::TF_ImportGraphDefOptionsAddInputMapping(
                    opts,
                    name.as_ptr(),
                    *index,
                    op.output(*index),
                );
            }
            for ((_, op), name) in mappings.control.iter().zip(control_names) {
                sys::TF_ImportGraphDefOptionsRemapControlDependency(
                    opts,
                    name.as_ptr(),
                    op.as_ptr(),
                );
            }
            let result = with_status(|status| {
                sys::TF_GraphImportGraphDef(self.as_ptr(), &graph_def, opts, status)
            });
            sys::TF_DeleteImportGraphDefOptions(opts);
            result
        }
    }

    /// Adds an operation built from its parts.
    pub fn add_operation(
        &self,
        op_type: &str,
        name: &str,
        inputs: &[OpInput],
        control: &[Operation],
        attrs: &[(&str, Attr<'_>)],
    ) -> Result<Operation, TfError> {
        let cstring =
            |s: &str| CString::new(s).map_err(|_| TfError::new(3, format!("{s:?} contains NUL")));
        let op_type = cstring(op_type)?;
        let name = cstring(name)?;
        let attr_names: Vec<CString> = attrs
            .iter()
            .map(|(n, _)| cstring(n))
            .collect::<Result<_, _>>()?;
        // SAFETY: the description is created here and finished (which frees it)
        // on every path; every pointer handed to TF outlives the calls.
        unsafe {
            let desc = sys::TF_NewOperation(self.as_ptr(), op_type.as_ptr(), name.as_ptr());
            for input in inputs {
                match input {
                    OpInput::One(output) => sys::TF_AddInput(desc, *output),
                    OpInput::List(outputs) => {
                        sys::TF_AddInputList(desc, outputs.as_ptr(), outputs.len() as i32)
                    }
                }
            }
            for op in control {
                sys::TF_AddControlInput(desc, op.as_ptr());
            }
            let mut attr_status = Ok(());
            for ((_, value), attr) in attrs.iter().zip(&attr_names) {
                match value {
                    Attr::Str(v) => {
                        sys::TF_SetAttrString(desc, attr.as_ptr(), v.as_ptr().cast(), v.len())
                    }
                    Attr::Bool(v) => sys::TF_SetAttrBool(desc, attr.as_ptr(), u8::from(*v)),
                    Attr::Int(v) => sys::TF_SetAttrInt(desc, attr.as_ptr(), *v),
                    Attr::Type(v) => sys::TF_SetAttrType(desc, attr.as_ptr(), *v),
                    Attr::Tensor(t) => {
                        let result = with_status(|status| {
                            sys::TF_SetAttrTensor(desc, attr.as_ptr(), t.as_ptr(), status)
                        });
                        if attr_status.is_ok() {
                            attr_status = result;
                        }
                    }
                }
            }
            let op = with_status(|status| sys::TF_FinishOperation(desc, status));
            attr_status?;
            NonNull::new(op?)
                .map(Operation)
                .ok_or_else(|| TfError::new(13, "TF_FinishOperation returned no operation"))
        }
    }

    /// Makes input `index` of `consumer` read `source` instead. Only for
    /// operations no session has run yet (TensorFlow refuses the others).
    pub fn update_edge(
        &self,
        source: sys::TF_Output,
        consumer: Operation,
        index: i32,
    ) -> Result<(), TfError> {
        let input = sys::TF_Input {
            oper: consumer.as_ptr(),
            index,
        };
        // SAFETY: live graph and operations of it.
        unsafe { with_status(|status| sys::TF_UpdateEdge(self.as_ptr(), source, input, status)) }
    }

    /// Adds `DestroyResourceOp(handle:0)` named `name` (or returns the existing
    /// operation of that name): running it frees the resource, if it exists.
    pub fn destroy_resource_op(&self, name: &str, handle: Operation) -> Result<Operation, TfError> {
        if let Some(op) = self.operation(name) {
            return Ok(op);
        }
        let c_name = CString::new(name)
            .map_err(|_| TfError::new(3, format!("node name {name:?} contains NUL")))?;
        // SAFETY: the description is finished (consumed) exactly once; strings
        // outlive the calls.
        unsafe {
            let desc = sys::TF_NewOperation(
                self.as_ptr(),
                c"DestroyResourceOp".as_ptr(),
                c_name.as_ptr(),
            );
            sys::TF_AddInput(desc, handle.output(0));
            sys::TF_SetAttrBool(desc, c"ignore_lookup_error".as_ptr(), 1);
            let op = with_status(|status| sys::TF_FinishOperation(desc, status))?;
            NonNull::new(op)
                .map(Operation)
                .ok_or_else(|| TfError::new(13, "TF_FinishOperation returned null"))
        }
    }

    /// Number of operations (walks the graph).
    pub fn num_operations(&self) -> usize {
        let mut pos: usize = 0;
        let mut count = 0;
        // SAFETY: live graph; TF_GraphNextOperation advances `pos` and returns null at the end.
        while !unsafe { sys::TF_GraphNextOperation(self.as_ptr(), &mut pos) }.is_null() {
            count += 1;
        }
        count
    }
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: owned graph, deleted once; sessions using it hold an Arc to it.
        unsafe { sys::TF_DeleteGraph(self.as_ptr()) }
    }
}

/// The NUL-terminated version string of the linked TensorFlow.
pub fn tensorflow_version() -> String {
    // SAFETY: TF_Version returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::TF_Version()) }
        .to_string_lossy()
        .into_owned()
}
