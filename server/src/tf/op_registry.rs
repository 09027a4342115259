//! Facts about TensorFlow's registered ops, read once from its registry.

use std::collections::HashSet;
use std::sync::OnceLock;

use prost::Message;
use salus_proto::tensorflow::OpListView;
use tensorflow_sys as sys;

use super::buffer::OutputBuffer;

/// Names of the registered ops that declare no outputs (SaveV2, AssignVariableOp,
/// WriteFile, NoOp, ...).
fn ops_without_outputs() -> &'static HashSet<String> {
    static OPS: OnceLock<HashSet<String>> = OnceLock::new();
    OPS.get_or_init(|| {
        // SAFETY: TF_GetAllOpList returns a new buffer that the caller owns.
        let Some(buffer) = OutputBuffer::from_raw(unsafe { sys::TF_GetAllOpList() }) else {
            return HashSet::new();
        };
        let bytes = buffer.to_vec();
        OpListView::decode(bytes.as_slice())
            .map(|list| {
                list.op
                    .into_iter()
                    .filter(|op| op.output_arg.is_empty())
                    .map(|op| op.name)
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Whether `op` is a registered op that declares no outputs: a client learns
/// of its failure only from a later sync, never from a use of its results.
pub fn has_no_outputs(op: &str) -> bool {
    ops_without_outputs().contains(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_which_ops_have_no_outputs() {
        for op in [
            "SaveV2",
            "MergeV2Checkpoints",
            "AssignVariableOp",
            "WriteFile",
            "NoOp",
        ] {
            assert!(has_no_outputs(op), "{op}");
        }
        for op in ["MatMul", "ReadFile", "RestoreV2", "VarHandleOp", "NotAnOp"] {
            assert!(!has_no_outputs(op), "{op}");
        }
    }
}
