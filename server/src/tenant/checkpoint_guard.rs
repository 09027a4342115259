//! Confines the file paths of checkpoint ops (Save/Restore) to the job's
//! checkpoint directory.
//!
//! The path reaches a Save op as a tensor, usually fed at run time (TF1's
//! Saver feeds `save/Const:0`), so it cannot be checked when the graph
//! arrives. Instead, when a checkpoint op is imported (before any session has
//! run it), its path input is rerouted through a guard built from TensorFlow's
//! own ops: relative paths are placed under the directory, and an `Assert`
//! fails the step unless every resulting path lies inside it (no `.` or `..`
//! components, no escape through a URL scheme, which becomes a plain file name
//! under the directory). The check thus holds for every way the path may be
//! computed: fed, constant, or joined from pieces.

use std::path::Path;

use salus_proto::tensorflow::{DataType, TensorProto};
use tensorflow_sys as sys;

use crate::error::{Error, Result};
use crate::tenant::op_policy::checkpoint_path_inputs;
use crate::tf::{Attr, Graph, OpInput, Operation, Tensor};

/// Names of the guard's nodes start with this; client nodes may not.
pub const RESERVED_PREFIX: &str = "salus_checkpoint_guard/";

/// RE2's QuoteMeta: escapes everything but ASCII letters, digits, `_` and
/// bytes above 0x7f.
fn quote_meta(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii()) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A path inside `dir`: one or more components below it, none `.` or `..`.
fn inside_pattern(dir: &str) -> String {
    format!(
        r"{}(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))+",
        quote_meta(dir)
    )
}

/// The path an eager checkpoint op may use for `path`: relative paths are
/// placed in `dir`; the result must lie inside it (the same rule the graph
/// guard enforces), else `None`.
pub fn confined_path(dir: &str, path: &str) -> Option<String> {
    let resolved = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{dir}/{path}")
    };
    let rest = resolved.strip_prefix(dir)?.strip_prefix('/')?;
    rest.split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
        .then_some(resolved)
}

fn scalar(dtype: DataType, fill: impl FnOnce(&mut TensorProto)) -> Result<Tensor> {
    let mut proto = TensorProto {
        dtype: dtype as i32,
        tensor_shape: Some(Default::default()),
        ..Default::default()
    };
    fill(&mut proto);
    Tensor::from_proto(&proto, 1 << 20).map_err(|e| Error::Internal(format!("guard constant: {e}")))
}

/// Reroutes the path inputs of `node` (an imported, not yet run checkpoint op)
/// through a guard confining them to `dir` (absolute, without a trailing `/`).
pub fn confine(
    graph: &Graph,
    node: Operation,
    node_name: &str,
    op: &str,
    dir: &Path,
) -> Result<()> {
    let Some(inputs) = checkpoint_path_inputs(op) else {
        return Ok(());
    };
    let dir = dir
        .to_str()
        .ok_or_else(|| Error::Internal(format!("checkpoint directory {dir:?} is not UTF-8")))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Internal(format!("cannot create checkpoint directory {dir}: {e}")))?;
    let string = sys::TF_DataType::TF_STRING;
    let zero = scalar(DataType::DtInt32, |p| p.int_val = vec![0])?;
    let one = scalar(DataType::DtInt32, |p| p.int_val = vec![1])?;
    let message = scalar(DataType::DtString, |p| {
        p.string_val = vec![format!(
            "checkpoint path outside this job's checkpoint directory {dir} (relative paths are placed in it):"
        )
        .into_bytes()
        .into()]
    })?;
    let rewrite = format!("{}/", dir.replace('\\', "\\\\"));
    let inside = inside_pattern(dir);
    for &index in inputs {
        let name = |part: &str| format!("{RESERVED_PREFIX}{node_name}/{index}/{part}");
        let one_input = |op: Operation| OpInput::One(op.output(0));
        let add = |part: &str,
                   op_type: &str,
                   inputs: &[OpInput],
                   control: &[Operation],
                   attrs: &[(&str, Attr<'_>)]| {
            graph
                .add_operation(op_type, &name(part), inputs, control, attrs)
                .map_err(Error::from)
        };
        let path = || OpInput::One(node.input_source(index));
        let absolute = add(
            "absolute",
            "StaticRegexFullMatch",
            &[path()],
            &[],
            &[("pattern", Attr::Str("/.*"))],
        )?;
        let placed = add(
            "placed",
            "StaticRegexReplace",
            &[path()],
            &[],
            &[
                ("pattern", Attr::Str("^")),
                ("rewrite", Attr::Str(&rewrite)),
                ("replace_global", Attr::Bool(false)),
            ],
        )?;
        let resolved = add(
            "resolved",
            "SelectV2",
            &[one_input(absolute), path(), one_input(placed)],
            &[],
            &[],
        )?;
        let within = add(
            "inside",
            "StaticRegexFullMatch",
            &[one_input(resolved)],
            &[],
            &[("pattern", Attr::Str(&inside))],
        )?;
        let rank = add("rank", "Rank", &[one_input(within)], &[], &[])?;
        let zero = add(
            "zero",
            "Const",
            &[],
            &[],
            &[
                ("value", Attr::Tensor(&zero)),
                ("dtype", Attr::Type(sys::TF_DataType::TF_INT32)),
            ],
        )?;
        let one = add(
            "one",
            "Const",
            &[],
            &[],
            &[
                ("value", Attr::Tensor(&one)),
                ("dtype", Attr::Type(sys::TF_DataType::TF_INT32)),
            ],
        )?;
        let axes = add(
            "axes",
            "Range",
            &[one_input(zero), one_input(rank), one_input(one)],
            &[],
            &[],
        )?;
        let all = add(
            "all",
            "All",
            &[one_input(within), one_input(axes)],
            &[],
            &[],
        )?;
        let message = add(
            "message",
            "Const",
            &[],
            &[],
            &[
                ("value", Attr::Tensor(&message)),
                ("dtype", Attr::Type(string)),
            ],
        )?;
        let check = add(
            "assert",
            "Assert",
            &[
                one_input(all),
                OpInput::List(vec![message.output(0), resolved.output(0)]),
            ],
            &[],
            &[("summarize", Attr::Int(16))],
        )?;
        let guarded = add("path", "Identity", &[one_input(resolved)], &[check], &[])?;
        graph.update_edge(guarded.output(0), node, index)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::tf::Session;

    fn string_tensor(values: &[&str]) -> Tensor {
        let proto = TensorProto {
            dtype: DataType::DtString as i32,
            tensor_shape: Some(salus_proto::tensorflow::TensorShapeProto {
                dim: vec![salus_proto::tensorflow::tensor_shape_proto::Dim {
                    size: values.len() as i64,
                    name: String::new(),
                }],
                unknown_rank: false,
            }),
            string_val: values
                .iter()
                .map(|v| v.as_bytes().to_vec().into())
                .collect(),
            ..Default::default()
        };
        Tensor::from_proto(&proto, 1 << 20).unwrap()
    }

    /// A SaveV2 of one float under a fed prefix, confined to a fresh directory.
    #[test]
    fn saves_go_inside_the_directory_and_escapes_fail_the_step() {
        let dir = std::env::temp_dir().join(format!("salus-guard-{}", std::process::id()));
        let graph = Arc::new(Graph::new());
        let add = |name: &str, op: &str, inputs: &[OpInput], attrs: &[(&str, Attr<'_>)]| {
            graph.add_operation(op, name, inputs, &[], attrs).unwrap()
        };
        let prefix = add(
            "prefix",
            "Placeholder",
            &[],
            &[("dtype", Attr::Type(sys::TF_DataType::TF_STRING))],
        );
        let names = string_tensor(&["v"]);
        let slices = string_tensor(&[""]);
        let value = scalar(DataType::DtFloat, |p| p.float_val = vec![1.5]).unwrap();
        let constant = |name: &str, t: &Tensor, dtype| {
            add(
                name,
                "Const",
                &[],
                &[("value", Attr::Tensor(t)), ("dtype", Attr::Type(dtype))],
            )
        };
        let names = constant("names", &names, sys::TF_DataType::TF_STRING);
        let slices = constant("slices", &slices, sys::TF_DataType::TF_STRING);
        let value = constant("value", &value, sys::TF_DataType::TF_FLOAT);
        let save = add(
            "save",
            "SaveV2",
            &[
                OpInput::One(prefix.output(0)),
                OpInput::One(names.output(0)),
                OpInput::One(slices.output(0)),
                OpInput::List(vec![value.output(0)]),
            ],
            &[],
        );
        confine(&graph, save, "save", "SaveV2", &dir).unwrap();
        let session = Session::new(graph.clone(), &[]).unwrap();
        let run = |path: &str| {
            let fed = scalar(DataType::DtString, |p| {
                p.string_val = vec![path.as_bytes().to_vec().into()]
            })
            .unwrap();
            session.run(&[], false, &[(prefix.output(0), &fed)], &[], &[save])
        };
        // Relative: placed in the directory.
        run("nested/model").unwrap();
        assert!(dir.join("nested/model.index").exists());
        // Absolute inside: as given.
        let inside = format!("{}/abs", dir.display());
        run(&inside).unwrap();
        assert!(dir.join("abs.index").exists());
        for escape in [
            "/tmp/salus-escape",
            "../escape",
            "a/../../escape",
            "file:///tmp/x",
            "",
        ] {
            let Err(err) = run(escape) else {
                panic!("{escape} was saved")
            };
            assert_eq!(err.code, 3, "{escape}: {err}");
            assert!(
                err.message.contains("checkpoint path outside this job"),
                "{err}"
            );
        }
        assert!(!Path::new("/tmp/salus-escape.index").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn eager_paths_are_confined_like_graph_paths() {
        let dir = "/srv/ckpt/job";
        assert_eq!(
            confined_path(dir, "model").as_deref(),
            Some("/srv/ckpt/job/model")
        );
        assert_eq!(
            confined_path(dir, "a/b_temp/part-0").as_deref(),
            Some("/srv/ckpt/job/a/b_temp/part-0")
        );
        assert_eq!(
            confined_path(dir, "/srv/ckpt/job/x").as_deref(),
            Some("/srv/ckpt/job/x")
        );
        for escape in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "",
            "/srv/ckpt/job",
            "/srv/ckpt/jobX/y",
            "a//b",
            "./a",
        ] {
            assert_eq!(confined_path(dir, escape), None, "{escape:?}");
        }
        assert_eq!(confined_path(dir, "file:///etc/x").as_deref(), None);
    }

    #[test]
    fn the_inside_pattern_admits_only_paths_below_the_directory() {
        let re = inside_pattern("/srv/ckpt+1");
        assert_eq!(re, r"\/srv\/ckpt\+1(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))+");
        assert_eq!(quote_meta("a.b/c é"), r"a\.b\/c\ é");
    }
}
