//! Checkpoint confinement: a checkpoint op's paths kept inside the job's
//! checkpoint directory.

use super::*;

impl Worker {
    /// A checkpoint op's path inputs, confined to the job's checkpoint
    /// directory: relative paths are placed in it, a path outside fails the op
    /// with INVALID_ARGUMENT (the rule graph jobs' guards enforce).
    pub(super) fn confine_checkpoint_paths(
        &self,
        op: &OpRequest,
    ) -> Result<HashMap<usize, TensorHandle>> {
        let Some(indices) =
            checkpoint_path_inputs(&op.name).filter(|_| self.shared.tenant.confined)
        else {
            return Ok(HashMap::new());
        };
        let dir = self.shared.checkpoint_dir.to_str().ok_or_else(|| {
            Error::Internal(format!(
                "checkpoint directory {:?} is not UTF-8",
                self.shared.checkpoint_dir
            ))
        })?;
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Internal(format!("cannot create checkpoint directory {dir}: {e}"))
        })?;
        let writes = matches!(
            op.name.as_str(),
            "SaveV2" | "Save" | "SaveSlices" | "MergeV2Checkpoints"
        );
        let mut confined = HashMap::new();
        for &index in indices {
            let index = index as usize;
            let tensor = match op.inputs.get(index) {
                Some(OpInput::Handle { op_id, output }) => {
                    let table = read(&self.shared.handles);
                    self.handle(&table, *op_id, *output)?.resolve()?
                }
                Some(OpInput::Tensor(proto)) => {
                    Tensor::from_proto(proto, self.shared.max_tensor_bytes).map_err(|e| {
                        Error::tensor(format!("path input {index} of {}", op.name), e)
                    })?
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "{} needs a path as input {index}",
                        op.name
                    )));
                }
            };
            if tensor.dtype_raw() != DataType::DtString as i32 {
                return Err(Error::InvalidArgument(format!(
                    "input {index} of {} must be a string path",
                    op.name
                )));
            }
            let paths = tensor
                .strings()
                .iter()
                .map(|raw| confine_one(dir, &String::from_utf8_lossy(raw), writes))
                .collect::<Result<Vec<_>>>()?;
            let proto = TensorProto {
                dtype: DataType::DtString as i32,
                tensor_shape: Some(shape_proto(tensor.dims())),
                string_val: paths,
                ..Default::default()
            };
            let tensor = Tensor::from_proto(&proto, self.shared.max_tensor_bytes.max(1 << 20))
                .map_err(|e| Error::tensor(format!("path input {index} of {}", op.name), e))?;
            confined.insert(index, TensorHandle::from_tensor(&tensor)?);
        }
        Ok(confined)
    }
}

/// One path of a checkpoint op, confined to `dir` (see
/// [`Worker::confine_checkpoint_paths`]); `writes`: the op writes there.
fn confine_one(dir: &str, path: &str, writes: bool) -> Result<Bytes> {
    let confined = checkpoint_guard::confined_path(dir, path).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "checkpoint path {path:?} is outside this job's checkpoint directory {dir} \
             (relative paths are placed in it)"
        ))
    })?;
    if writes {
        // The client would have made the prefix's directory on its
        // own machine; here it is made inside the job's directory.
        if let Some(parent) = std::path::Path::new(&confined).parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                Error::Internal(format!(
                    "cannot create checkpoint directory {parent:?}: {e}"
                ))
            })?;
        }
    }
    Ok(Bytes::from(confined))
}
