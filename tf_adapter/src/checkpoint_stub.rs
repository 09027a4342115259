//! A stand-in for a library function that holds checkpoint ops (a TF2 SavedModel's traced
//! save/restore functions). The server refuses checkpoint ops inside functions, but graph
//! nodes of the model still call these functions by name, so the shim swaps each for a
//! function of the same name and signature that fails with a clear message when called.
//! Serving needs neither: the variables' values are shipped by the shim.

use crate::wire::{
    fields, read_varint, submessages, write_len_field, write_varint, MalformedProto, WIRE_VARINT,
};

/// FunctionDef: signature (1, an OpDef), node_def (3), ret (4, map<string, string>).
const SIGNATURE_FIELD: u64 = 1;
const NODE_DEF_FIELD: u64 = 3;
const RET_FIELD: u64 = 4;
/// OpDef: input_arg (2), output_arg (3); ArgDef: name (1), type (3).
const INPUT_ARG_FIELD: u64 = 2;
const OUTPUT_ARG_FIELD: u64 = 3;
const ARG_NAME_FIELD: u64 = 1;
const ARG_TYPE_FIELD: u64 = 3;
/// NodeDef: name (1), op (2), input (3), attr (5, map<string, AttrValue>).
/// AttrValue: list (1), i (3), type (6), tensor (8); ListValue.type (6).
/// TensorProto: dtype (1), tensor_shape (2), string_val (8), bool_val (11).
const DT_STRING: u64 = 7;
const DT_BOOL: u64 = 10;

pub const REFUSAL: &str = "salus: this SavedModel function saves or restores a checkpoint, which the Salus \
    server refuses inside functions; the Salus TF shim loaded the model's values on the client instead. \
    Save the model from a program run with SALUS_SERVER unset";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StubError {
    Malformed,
    /// An output whose type is not fixed or that no input has the type of.
    Unsupported(String),
}

impl From<MalformedProto> for StubError {
    fn from(_: MalformedProto) -> Self {
        StubError::Malformed
    }
}

struct Arg {
    name: String,
    dtype: Option<u64>,
}

fn args(signature: &[u8], number: u64) -> Result<Vec<Arg>, MalformedProto> {
    let mut out = Vec::new();
    for arg in submessages(signature, number)? {
        let mut name = String::new();
        let mut dtype = None;
        for f in fields(arg)? {
            match (f.number, f.bytes) {
                (ARG_NAME_FIELD, Some(b)) => name = String::from_utf8_lossy(b).into_owned(),
                (ARG_TYPE_FIELD, None) => dtype = Some(varint_value(arg, ARG_TYPE_FIELD)?),
                _ => {}
            }
        }
        out.push(Arg { name, dtype });
    }
    Ok(out)
}

/// The last varint value of field `number` (fields() skips varint payloads).
fn varint_value(buf: &[u8], number: u64) -> Result<u64, MalformedProto> {
    let mut pos = 0;
    let mut found = None;
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        match key & 7 {
            0 => {
                let v = read_varint(buf, &mut pos)?;
                if key >> 3 == number {
                    found = Some(v);
                }
            }
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let len = read_varint(buf, &mut pos)? as usize;
                pos = pos.checked_add(len).ok_or(MalformedProto)?;
            }
            _ => return Err(MalformedProto),
        }
    }
    found.ok_or(MalformedProto)
}

fn varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    write_varint(out, (number << 3) | u64::from(WIRE_VARINT));
    write_varint(out, value);
}

fn attr(node: &mut Vec<u8>, key: &str, value: &[u8]) {
    let mut entry = Vec::new();
    write_len_field(&mut entry, 1, key.as_bytes());
    write_len_field(&mut entry, 2, value);
    write_len_field(node, 5, &entry);
}

fn type_attr(dtype: u64) -> Vec<u8> {
    let mut v = Vec::new();
    varint_field(&mut v, 6, dtype);
    v
}

fn node(name: &str, op: &str, inputs: &[&str], attrs: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut n = Vec::new();
    write_len_field(&mut n, 1, name.as_bytes());
    write_len_field(&mut n, 2, op.as_bytes());
    for input in inputs {
        write_len_field(&mut n, 3, input.as_bytes());
    }
    for (key, value) in attrs {
        attr(&mut n, key, value);
    }
    n
}

/// A scalar Const node's attrs: dtype and a TensorProto with `value` written by `fill`.
fn const_attrs(dtype: u64, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<(&'static str, Vec<u8>)> {
    let mut tensor = Vec::new();
    varint_field(&mut tensor, 1, dtype);
    write_len_field(&mut tensor, 2, &[]); // scalar shape
    fill(&mut tensor);
    let mut value = Vec::new();
    write_len_field(&mut value, 8, &tensor);
    vec![("dtype", type_attr(dtype)), ("value", value)]
}

/// The stand-in FunctionDef for `function_def`: same signature; every output passes an input
/// of its type through, after an Assert(false, REFUSAL) that makes any call fail.
pub fn refusing_stub(function_def: &[u8]) -> Result<Vec<u8>, StubError> {
    let signature = submessages(function_def, SIGNATURE_FIELD)?
        .first()
        .copied()
        .ok_or(StubError::Malformed)?;
    let inputs = args(signature, INPUT_ARG_FIELD)?;
    let outputs = args(signature, OUTPUT_ARG_FIELD)?;

    let mut stub = Vec::new();
    write_len_field(&mut stub, SIGNATURE_FIELD, signature);
    let cond = node(
        "salus_refused_cond",
        "Const",
        &[],
        &const_attrs(DT_BOOL, |t| write_len_field(t, 11, &[0])),
    );
    let message = node(
        "salus_refused_message",
        "Const",
        &[],
        &const_attrs(DT_STRING, |t| write_len_field(t, 8, REFUSAL.as_bytes())),
    );
    let mut string_list = Vec::new();
    write_len_field(&mut string_list, 6, &[DT_STRING as u8]); // packed repeated type
    let mut list_attr = Vec::new();
    write_len_field(&mut list_attr, 1, &string_list);
    let mut summarize = Vec::new();
    varint_field(&mut summarize, 3, 3);
    let assert = node(
        "salus_refused",
        "Assert",
        &[
            "salus_refused_cond:output:0",
            "salus_refused_message:output:0",
        ],
        &[("T", list_attr), ("summarize", summarize)],
    );
    for n in [cond, message, assert] {
        write_len_field(&mut stub, NODE_DEF_FIELD, &n);
    }
    for (i, output) in outputs.iter().enumerate() {
        let dtype = output.dtype.ok_or_else(|| {
            StubError::Unsupported(format!("output {} has no fixed type", output.name))
        })?;
        let source = inputs
            .iter()
            .find(|input| input.dtype == Some(dtype))
            .ok_or_else(|| {
                StubError::Unsupported(format!("no input has the type of output {}", output.name))
            })?;
        let name = format!("salus_refused_out{i}");
        let identity = node(
            &name,
            "Identity",
            &[&source.name, "^salus_refused"],
            &[("T", type_attr(dtype))],
        );
        write_len_field(&mut stub, NODE_DEF_FIELD, &identity);
        let mut ret = Vec::new();
        write_len_field(&mut ret, 1, output.name.as_bytes());
        write_len_field(&mut ret, 2, format!("{name}:output:0").as_bytes());
        write_len_field(&mut stub, RET_FIELD, &ret);
    }
    Ok(stub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(name: &str, dtype: u64) -> Vec<u8> {
        let mut a = Vec::new();
        write_len_field(&mut a, ARG_NAME_FIELD, name.as_bytes());
        varint_field(&mut a, ARG_TYPE_FIELD, dtype);
        a
    }

    fn function(inputs: &[(&str, u64)], outputs: &[(&str, u64)]) -> Vec<u8> {
        let mut sig = Vec::new();
        write_len_field(&mut sig, 1, b"__inference__traced_save_1");
        for (n, t) in inputs {
            write_len_field(&mut sig, INPUT_ARG_FIELD, &arg(n, *t));
        }
        for (n, t) in outputs {
            write_len_field(&mut sig, OUTPUT_ARG_FIELD, &arg(n, *t));
        }
        let mut f = Vec::new();
        write_len_field(&mut f, SIGNATURE_FIELD, &sig);
        write_len_field(&mut f, NODE_DEF_FIELD, &node("save", "SaveV2", &[], &[]));
        f
    }

    #[test]
    fn stub_keeps_the_signature_and_drops_checkpoint_ops() {
        const DT_RESOURCE: u64 = 20;
        let original = function(
            &[("file_prefix", DT_STRING), ("w", DT_RESOURCE)],
            &[("identity", DT_STRING)],
        );
        let stub = refusing_stub(&original).unwrap();
        assert_eq!(
            submessages(&stub, SIGNATURE_FIELD).unwrap(),
            submessages(&original, SIGNATURE_FIELD).unwrap()
        );
        let ops: Vec<String> = submessages(&stub, NODE_DEF_FIELD)
            .unwrap()
            .iter()
            .map(|n| String::from_utf8_lossy(submessages(n, 2).unwrap()[0]).into_owned())
            .collect();
        assert_eq!(ops, ["Const", "Const", "Assert", "Identity"]);
        let identity = submessages(&stub, NODE_DEF_FIELD).unwrap()[3];
        let inputs: Vec<&[u8]> = submessages(identity, 3).unwrap();
        assert_eq!(inputs, [&b"file_prefix"[..], &b"^salus_refused"[..]]);
        let ret = submessages(&stub, RET_FIELD).unwrap();
        assert_eq!(
            submessages(ret[0], 2).unwrap(),
            [&b"salus_refused_out0:output:0"[..]]
        );
    }

    #[test]
    fn outputs_without_a_matching_input_are_unsupported() {
        let f = function(&[("file_prefix", DT_STRING)], &[("flag", DT_BOOL)]);
        assert!(matches!(refusing_stub(&f), Err(StubError::Unsupported(_))));
        assert_eq!(refusing_stub(&[0x0a, 0x05]), Err(StubError::Malformed));
        assert_eq!(refusing_stub(&[]), Err(StubError::Malformed));
    }
}
