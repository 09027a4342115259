//! What a remote-eager client enqueues, as the runtime takes it: ops and
//! function calls with their inputs, function registrations, pushed tensors,
//! decrefs and syncs (frontend/eager/translate.rs builds them from the wire).

use bytes::Bytes;
use prost::Message;
use salus_proto::tensorflow::{attr_value, AttrValue, FunctionDefView, TensorProto};

/// An input of an op: an earlier output of this context, or a tensor sent inline.
#[derive(Debug, Clone)]
pub enum OpInput {
    Handle { op_id: i64, output: i32 },
    Tensor(TensorProto),
}

/// One op or function call, as the client enqueued it.
#[derive(Debug, Clone)]
pub struct OpRequest {
    pub id: i64,
    pub name: String,
    pub inputs: Vec<OpInput>,
    /// Serialized AttrValue protos by attribute name.
    pub attrs: Vec<(String, Bytes)>,
    /// The device in the client's names (mapped here).
    pub device: String,
    pub is_function: bool,
}

impl OpRequest {
    /// `_Send` ops hand a tensor to a `RecvTensor` pull instead of running.
    pub(crate) fn send_tensor_name(&self) -> Option<String> {
        if !matches!(self.name.as_str(), "_Send" | "_HostSend") {
            return None;
        }
        let attr = self.attrs.iter().find(|(k, _)| k == "tensor_name")?;
        match AttrValue::decode(attr.1.as_ref()).ok()?.value? {
            attr_value::Value::S(s) => Some(String::from_utf8_lossy(&s).into_owned()),
            _ => None,
        }
    }
}

/// One queue item of a request.
#[derive(Debug, Clone)]
pub enum Item {
    Execute(OpRequest),
    /// A FunctionDef and the functions it calls (serialized).
    RegisterFunction {
        function_def: Bytes,
        library: Vec<Bytes>,
    },
    /// Tensors the client pushes; they become outputs `0..n` of `op_id`.
    SendTensors {
        op_id: i64,
        tensors: Vec<TensorProto>,
        device: String,
    },
    Decref {
        op_id: i64,
        output: i32,
    },
    RemoveFunction(String),
    /// Per-step state of a component function; a sync context keeps none.
    CleanupFunction,
    /// Answers once everything queued before it has run.
    Sync,
    /// A `_Send` whose value went to its pull when the request arrived
    /// (`send_ready_values`); answered in its place.
    SentEarly(String),
}

impl Item {
    /// The handle (op id, output) a decref releases.
    pub fn decref_of(&self) -> Option<(i64, i32)> {
        match self {
            Item::Decref { op_id, output } => Some((*op_id, *output)),
            _ => None,
        }
    }

    /// A short description for trace logs.
    pub fn label(&self) -> String {
        match self {
            Item::Execute(op) => match op.send_tensor_name() {
                Some(name) => format!("send {name}"),
                None => format!("execute {} #{}", op.name, op.id),
            },
            Item::RegisterFunction { function_def, .. } => format!(
                "register function {}",
                FunctionDefView::decode(function_def.as_ref())
                    .ok()
                    .and_then(|view| view.signature)
                    .map(|signature| signature.name)
                    .unwrap_or_default()
            ),
            Item::SendTensors { op_id, .. } => format!("push #{op_id}"),
            Item::Decref { op_id, output } => format!("decref #{op_id}:{output}"),
            Item::RemoveFunction(name) => format!("remove function {name}"),
            Item::CleanupFunction => "cleanup function".into(),
            Item::Sync => "sync".into(),
            Item::SentEarly(name) => format!("send {name} (sent on arrival)"),
        }
    }

    pub(crate) fn send_tensor_name(&self) -> Option<String> {
        match self {
            Item::Execute(op) => op.send_tensor_name(),
            _ => None,
        }
    }
}

/// What one item produced: the shapes of its outputs and, for function calls,
/// their devices in the client's names.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ItemOutput {
    pub shapes: Vec<Vec<i64>>,
    pub devices: Vec<String>,
}
