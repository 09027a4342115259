//! Inspection of a client's GraphDef (or ExtendSession delta) before import.
//!
//! A delta may reference nodes imported earlier, by data input (`name`,
//! `name:3`) and by control input (`^name`). TensorFlow's importer rejects such
//! references unless each is mapped to the existing node, so this module works
//! out the mappings, and rejects duplicate names and dangling inputs with a clear
//! message before TensorFlow sees the graph.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use prost::Message;
use salus_proto::tensorflow::{attr_value, AttrValue, FunctionDefLibraryView, GraphDef, NodeDef};

use crate::error::Error;
use crate::runtime::job_history::ShapeHash;
use crate::tenant::checkpoint_guard::RESERVED_PREFIX;
use crate::tenant::op_policy::checkpoint_path_inputs;
use crate::tf::{Graph, ImportMappings};

/// Ops that put input into a queue or staging area for a training step to
/// take, and block while it is full. A run of one is the input pipeline of a
/// TF1 script (`QueueRunner` threads, a Python feeder thread), not an
/// iteration: scheduled as one, it would hold the lane while it waits for the
/// step that empties the queue, which waits for the lane.
pub const FEEDING_OPS: &[&str] = &[
    "QueueEnqueue",
    "QueueEnqueueV2",
    "QueueEnqueueMany",
    "QueueEnqueueManyV2",
    "Stage",
    "MapStage",
    "OrderedMapStage",
];

/// Why a graph cannot be imported.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GraphError {
    #[error("graph_def is not a valid GraphDef: {0}")]
    Malformed(String),
    #[error("node name {0:?} is not valid (empty, NUL, a leading ^, or the server's reserved salus_checkpoint_guard/ prefix)")]
    InvalidName(String),
    #[error("duplicate node name {0:?}: a node of that name already exists")]
    DuplicateNode(String),
    #[error("node {node:?} has input {input:?}, which names no node in the graph")]
    UnknownInput { node: String, input: String },
    #[error("node {node:?} has input {input:?}, but {target:?} has only {outputs} outputs")]
    OutputOutOfRange {
        node: String,
        input: String,
        target: String,
        outputs: i32,
    },
}

impl From<GraphError> for Error {
    fn from(err: GraphError) -> Error {
        Error::Graph(Box::new(err))
    }
}

/// A parsed input reference of a NodeDef.
#[derive(Debug, PartialEq, Eq)]
enum InputRef<'a> {
    Data { node: &'a str, index: i32 },
    Control { node: &'a str },
}

/// Parses "name", "name:3" or "^name".
fn parse_input(input: &str) -> InputRef<'_> {
    if let Some(node) = input.strip_prefix('^') {
        return InputRef::Control { node };
    }
    match input.rsplit_once(':') {
        Some((node, index)) => match index.parse::<i32>() {
            Ok(index) if index >= 0 => InputRef::Data { node, index },
            _ => InputRef::Data {
                node: input,
                index: 0,
            },
        },
        None => InputRef::Data {
            node: input,
            index: 0,
        },
    }
}

/// The result of checking a delta against the graph it extends.
#[derive(Debug, Default)]
pub struct CheckedDelta {
    pub mappings: ImportMappings,
    pub node_count: usize,
    /// Every op type in the delta (for policy checks and logs).
    pub ops: BTreeSet<String>,
    /// Op types used inside the delta's function library, with a function
    /// using each.
    pub library_ops: BTreeMap<String, String>,
    /// Checkpoint ops of the delta: (node name, op), to confine their paths.
    pub checkpoint_nodes: Vec<(String, String)>,
    /// Nodes with a `container` attribute: (node name, container), for Reset.
    pub containers: Vec<(String, String)>,
    /// Nodes that feed a queue or staging area ([`FEEDING_OPS`]).
    pub feeding_nodes: Vec<String>,
    /// Persistent memory the delta's variables declare (see [`variable_bytes`]).
    pub variables: VariableBytes,
    /// The delta's nodes' names and ops, hashed: part of the job's fingerprint.
    pub shape: ShapeHash,
}

pub use salus_node::runtime::report::VariableBytes;

/// Ops that create a variable whose value lives as long as the session.
const VARIABLE_OPS: &[&str] = &["VarHandleOp", "VariableV2", "Variable"];

/// The static size of the variable `node` creates: `Some(None)` for a variable
/// of unknown size, `None` for a node that is not a variable.
pub fn variable_bytes(node: &NodeDef) -> Option<Option<u64>> {
    if !VARIABLE_OPS.contains(&node.op.as_str()) {
        return None;
    }
    let dtype = match node.attr.get("dtype") {
        Some(AttrValue {
            value: Some(attr_value::Value::Type(t)),
        }) => *t,
        _ => return Some(None),
    };
    let element = crate::tf::tensor::dtype_info(dtype)
        .ok()
        .and_then(|info| info.element_size);
    let shape = match node.attr.get("shape") {
        Some(AttrValue {
            value: Some(attr_value::Value::Shape(shape)),
        }) if !shape.unknown_rank => shape,
        _ => return Some(None),
    };
    let mut count: u64 = 1;
    for dim in &shape.dim {
        if dim.size < 0 {
            return Some(None);
        }
        count = count.checked_mul(dim.size as u64)?;
    }
    Some(element.and_then(|size| count.checked_mul(size)))
}

/// Decodes `bytes` and checks it can be imported into `graph`.
pub fn check_delta(bytes: &[u8], graph: &Graph) -> Result<CheckedDelta, GraphError> {
    let def = GraphDef::decode(bytes).map_err(|e| GraphError::Malformed(e.to_string()))?;
    let mut names = HashSet::with_capacity(def.node.len());
    for node in &def.node {
        if node.name.is_empty()
            || node.name.contains('\0')
            || node.name.starts_with('^')
            || node.name.starts_with(RESERVED_PREFIX)
        {
            return Err(GraphError::InvalidName(node.name.clone()));
        }
        if !names.insert(node.name.as_str()) || graph.operation(&node.name).is_some() {
            return Err(GraphError::DuplicateNode(node.name.clone()));
        }
    }
    let mut checked = CheckedDelta {
        node_count: def.node.len(),
        ..Default::default()
    };
    let mut seen_data = HashSet::new();
    let mut seen_control = HashSet::new();
    if !def.library.is_empty() {
        let library = FunctionDefLibraryView::decode(def.library.as_ref())
            .map_err(|e| GraphError::Malformed(format!("function library: {e}")))?;
        for function in library.function {
            let name = function.signature.map(|s| s.name).unwrap_or_default();
            for node in function.node_def {
                checked
                    .library_ops
                    .entry(node.op)
                    .or_insert_with(|| name.clone());
            }
        }
    }
    for node in &def.node {
        checked.shape.add_node(&node.name, &node.op);
        checked.ops.insert(node.op.clone());
        if FEEDING_OPS.contains(&node.op.as_str()) {
            checked.feeding_nodes.push(node.name.clone());
        }
        if checkpoint_path_inputs(&node.op).is_some() {
            checked
                .checkpoint_nodes
                .push((node.name.clone(), node.op.clone()));
        }
        match variable_bytes(node) {
            Some(Some(bytes)) => {
                checked.variables += VariableBytes {
                    bytes,
                    variables: 1,
                    unknown: 0,
                }
            }
            Some(None) => {
                checked.variables += VariableBytes {
                    bytes: 0,
                    variables: 1,
                    unknown: 1,
                }
            }
            None => {}
        }
        if let Some(AttrValue {
            value: Some(attr_value::Value::S(container)),
        }) = node.attr.get("container")
        {
            checked.containers.push((
                node.name.clone(),
                String::from_utf8_lossy(container).into_owned(),
            ));
        }
        for input in &node.input {
            let parsed = parse_input(input);
            let target = match parsed {
                InputRef::Data { node, .. } | InputRef::Control { node } => node,
            };
            if names.contains(target) {
                continue;
            }
            let unknown = || GraphError::UnknownInput {
                node: node.name.clone(),
                input: input.clone(),
            };
            let op = graph.operation(target).ok_or_else(unknown)?;
            match parsed {
                InputRef::Data {
                    node: target,
                    index,
                } => {
                    if index >= op.num_outputs() {
                        return Err(GraphError::OutputOutOfRange {
                            node: node.name.clone(),
                            input: input.clone(),
                            target: target.to_string(),
                            outputs: op.num_outputs(),
                        });
                    }
                    if seen_data.insert((target, index)) {
                        checked.mappings.data.push((target.to_string(), index, op));
                    }
                }
                InputRef::Control { node: target } => {
                    if seen_control.insert(target) {
                        checked.mappings.control.push((target.to_string(), op));
                    }
                }
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    use salus_proto::tensorflow::{tensor_shape_proto::Dim, DataType, TensorShapeProto};

    fn variable(op: &str, dtype: DataType, dims: &[i64]) -> NodeDef {
        let shape = TensorShapeProto {
            dim: dims
                .iter()
                .map(|&size| Dim {
                    size,
                    name: String::new(),
                })
                .collect(),
            unknown_rank: false,
        };
        NodeDef {
            name: "v".into(),
            op: op.into(),
            attr: [
                (
                    "dtype".to_string(),
                    AttrValue {
                        value: Some(attr_value::Value::Type(dtype as i32)),
                    },
                ),
                (
                    "shape".to_string(),
                    AttrValue {
                        value: Some(attr_value::Value::Shape(shape)),
                    },
                ),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn unplaced_nodes_get_the_default_device_and_placed_ones_keep_theirs() {
        let mut pinned = variable("VarHandleOp", DataType::DtFloat, &[2]);
        pinned.name = "pinned".into();
        pinned.device = "/device:CPU:0".into();
        let delta = GraphDef {
            node: vec![variable("VarHandleOp", DataType::DtFloat, &[2]), pinned],
            ..Default::default()
        }
        .encode_to_vec();
        let graph = Graph::new();
        let checked = check_delta(&delta, &graph).unwrap();
        graph
            .import(&delta, &checked.mappings, Some("/device:GPU:1"))
            .unwrap();
        let device = |name: &str| graph.operation(name).unwrap().device();
        assert_eq!(device("v"), "/device:GPU:1");
        assert_eq!(device("pinned"), "/device:CPU:0");
    }

    #[test]
    fn enqueue_nodes_are_found_as_feeding_ones() {
        let node = |name: &str, op: &str| NodeDef {
            name: name.into(),
            op: op.into(),
            ..Default::default()
        };
        let delta = GraphDef {
            node: vec![
                node("q", "FIFOQueueV2"),
                node("enqueue", "QueueEnqueueV2"),
                node("enqueue_many", "QueueEnqueueManyV2"),
                node("dequeue", "QueueDequeueV2"),
                node("stage", "Stage"),
            ],
            ..Default::default()
        }
        .encode_to_vec();
        let checked = check_delta(&delta, &Graph::new()).unwrap();
        assert_eq!(checked.feeding_nodes, ["enqueue", "enqueue_many", "stage"]);
    }

    #[test]
    fn variables_declare_their_persistent_bytes() {
        assert_eq!(
            variable_bytes(&variable("VarHandleOp", DataType::DtFloat, &[784, 128])),
            Some(Some(784 * 128 * 4))
        );
        assert_eq!(
            variable_bytes(&variable("VariableV2", DataType::DtInt64, &[])),
            Some(Some(8))
        );
        assert_eq!(
            variable_bytes(&variable("VarHandleOp", DataType::DtFloat, &[-1, 3])),
            Some(None)
        );
        assert_eq!(
            variable_bytes(&variable("VarHandleOp", DataType::DtString, &[2])),
            Some(None)
        );
        assert_eq!(
            variable_bytes(&variable("Const", DataType::DtFloat, &[2])),
            None
        );
    }

    #[test]
    fn parses_input_forms() {
        assert_eq!(
            parse_input("a"),
            InputRef::Data {
                node: "a",
                index: 0
            }
        );
        assert_eq!(
            parse_input("a:2"),
            InputRef::Data {
                node: "a",
                index: 2
            }
        );
        assert_eq!(parse_input("^a"), InputRef::Control { node: "a" });
        assert_eq!(
            parse_input("scope/a:10"),
            InputRef::Data {
                node: "scope/a",
                index: 10
            }
        );
    }
}
