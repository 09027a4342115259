//! A client's FunctionDef on its way to an eager context: decoded, checked
//! against the tenant's rules, and its nodes' devices mapped to this server's
//! names. Context-free, so the fuzz target `eager_decode` runs the real thing.

use prost::Message;
use salus_proto::tensorflow::FunctionDefView;

use crate::error::Error;
use crate::runtime::eager_devices::DeviceNames;
use crate::runtime::job_history::ShapeHash;
use crate::tenant::TenantRules;
use crate::wire;

/// FunctionDef.node_def and NodeDef.device field numbers.
const FUNCTION_NODE_DEF_FIELD: u64 = 3;
const NODE_DEVICE_FIELD: u64 = 4;

/// A client's FunctionDef as this context hands it to TensorFlow.
#[derive(Debug)]
pub struct MappedFunction {
    pub name: String,
    /// The client's bytes with only its nodes' devices mapped to this server's names.
    pub mapped: Vec<u8>,
    /// The signature has no outputs (such a call's failure is reported later).
    pub without_outputs: bool,
    /// Its nodes' names and ops, hashed (its fingerprint as a main iteration).
    pub shape: ShapeHash,
}

/// Why a FunctionDef was not mapped.
#[derive(Debug)]
pub enum FunctionRefusal {
    /// Not a FunctionDef this server can read.
    Malformed(Error),
    /// The tenant's rules refuse it: remembered by name, to refuse its use.
    Refused { name: String, error: Error },
}

/// Everything `register_function` does before TensorFlow sees the function: decode
/// it, check it against the tenant's rules, and map its nodes' devices (the
/// context-free part the fuzz target `eager_decode` runs).
pub fn map_function(
    def: &[u8],
    devices: &DeviceNames,
    rules: &TenantRules,
) -> std::result::Result<MappedFunction, FunctionRefusal> {
    let malformed = |message: String| FunctionRefusal::Malformed(Error::InvalidArgument(message));
    let view = FunctionDefView::decode(def)
        .map_err(|e| malformed(format!("malformed FunctionDef: {e}")))?;
    let name = view
        .signature
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    if name.is_empty() {
        return Err(malformed("a FunctionDef without a signature name".into()));
    }
    if let Err(error) = rules.check_function(&name, view.node_def.iter().map(|n| n.op.as_str())) {
        return Err(FunctionRefusal::Refused { name, error });
    }
    let mapped = wire::rewrite_nested_fields(
        def,
        FUNCTION_NODE_DEF_FIELD,
        NODE_DEVICE_FIELD,
        &mut |device| {
            devices
                .node_to_local(std::str::from_utf8(device).ok()?)
                .map(String::into_bytes)
        },
    )
    .map_err(|e| malformed(format!("malformed FunctionDef {name:?}: {e}")))?;
    let without_outputs = view
        .signature
        .as_ref()
        .is_some_and(|s| s.output_arg.is_empty());
    let mut shape = ShapeHash::default();
    for node in &view.node_def {
        shape.add_node(&node.name, &node.op);
    }
    Ok(MappedFunction {
        name,
        mapped,
        without_outputs,
        shape,
    })
}
