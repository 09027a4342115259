//! What a tenant's job may do on the server: which ops its graphs may use,
//! where its checkpoints go, and how large its graphs may be; and who a
//! loopback client is ([`peer_uid`], groundwork for per-tenant identity).

pub mod admins;
pub mod connections;
pub mod grants;
pub mod identity;
pub mod limits;
pub mod op_policy;
pub mod peer_uid;
pub mod tokens;
pub mod uid_pool;
pub mod users;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sched::JobId;
use crate::tenant::op_policy::{checkpoint_path_inputs, OpPolicy};

/// Where checkpoint ops may write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointRoot {
    /// Each job gets `BASE/<job name>` (or `BASE/job-<id>` without a name):
    /// the default, so tenants never see each other's files, and a job that
    /// comes back under its name finds its checkpoints.
    PerJob(PathBuf),
    /// `--checkpoint-root DIR`: one directory for every job (tenants share it).
    Shared(PathBuf),
}

impl CheckpointRoot {
    /// The directory of one job (absolute when the root is).
    pub fn dir_for(&self, job_name: &str, id: JobId) -> PathBuf {
        match self {
            CheckpointRoot::Shared(dir) => dir.clone(),
            CheckpointRoot::PerJob(base) => {
                let safe: String = job_name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                match safe.trim_start_matches('.') {
                    "" => base.join(format!("job-{}", id.0)),
                    name => base.join(name),
                }
            }
        }
    }
}

/// The rules every job's graph is held to.
#[derive(Clone, Debug)]
pub struct TenantRules {
    pub ops: OpPolicy,
    pub checkpoints: CheckpointRoot,
    /// Largest serialized GraphDef one request may carry, bytes.
    pub max_graph_bytes: u64,
    /// Most tensor handles an eager context may hold at once.
    pub max_context_handles: usize,
    /// Most functions an eager context may have registered at once.
    pub max_context_functions: usize,
    /// Whether the op deny list and checkpoint confinement apply: they do for a
    /// tenant whose computation runs with permissions not its own. A tenant
    /// whose Unix user is the process's own ([`TenantRules::for_own_user`]) may
    /// do what it could do in its own process.
    pub confined: bool,
}

impl Default for TenantRules {
    fn default() -> Self {
        TenantRules {
            ops: OpPolicy::default(),
            checkpoints: CheckpointRoot::PerJob(default_checkpoint_base()),
            max_graph_bytes: 1 << 30,
            max_context_handles: 1_000_000,
            max_context_functions: 10_000,
            confined: true,
        }
    }
}

/// `salus-checkpoints` in the server's working directory, made absolute.
pub fn default_checkpoint_base() -> PathBuf {
    absolute(Path::new("salus-checkpoints"))
}

/// `path` made absolute against the working directory, without touching the
/// filesystem (the directory may not exist yet).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl TenantRules {
    /// The same limits without the deny list and checkpoint confinement: for a
    /// tenant whose computation runs as its own Unix user, where every file op
    /// has exactly that user's permissions.
    pub fn for_own_user(&self) -> TenantRules {
        TenantRules {
            confined: false,
            ..self.clone()
        }
    }

    /// Checks a graph (delta) before it is imported: its size, its `ops` and
    /// the ops of its function library (`library_ops`: each op with a function
    /// using it), where checkpoint paths cannot be confined.
    pub fn check_graph(
        &self,
        graph_bytes: usize,
        ops: &BTreeSet<String>,
        library_ops: &BTreeMap<String, String>,
    ) -> Result<()> {
        if graph_bytes as u64 > self.max_graph_bytes {
            return Err(Error::ResourceExhausted(format!(
                "the graph is {graph_bytes} bytes; this server accepts at most {} per request (--max-graph-bytes)",
                self.max_graph_bytes
            )));
        }
        if !self.confined {
            return Ok(());
        }
        self.ops.check(ops.iter().map(String::as_str))?;
        self.ops
            .check(library_ops.keys().map(String::as_str))
            .map_err(|e| Error::PermissionDenied(format!("in the function library: {e}")))?;
        if let Some((op, function)) = library_ops
            .iter()
            .find(|(op, _)| checkpoint_path_inputs(op).is_some())
        {
            return Err(Error::PermissionDenied(format!(
                "op {op} in function {function:?}: checkpoint ops are allowed only in the graph itself, \
                 where the server can confine their paths to the job's checkpoint directory"
            )));
        }
        Ok(())
    }
}

/// What an eager job's checkpoint ops inside functions are refused with.
const EAGER_CHECKPOINT_REFUSAL: &str =
    "checkpoint ops inside functions are refused, since their paths cannot be \
     confined there; run them eagerly (tf.train.Checkpoint does on one server)";

impl TenantRules {
    /// Checks one op an eager client runs outside any function (checkpoint
    /// ops pass: their paths are confined when they run).
    pub fn check_eager_op(&self, op: &str) -> Result<()> {
        if !self.confined {
            return Ok(());
        }
        self.ops.check([op])
    }

    /// Checks the ops of a function an eager client registers.
    pub fn check_function<'a>(
        &self,
        function: &str,
        ops: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        if !self.confined {
            return Ok(());
        }
        for op in ops {
            self.ops
                .check([op])
                .map_err(|e| Error::PermissionDenied(format!("in function {function:?}: {e}")))?;
            if checkpoint_path_inputs(op).is_some() {
                return Err(Error::PermissionDenied(format!(
                    "op {op} in function {function:?}: {EAGER_CHECKPOINT_REFUSAL}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_job_directories_are_named_safely() {
        let root = CheckpointRoot::PerJob(PathBuf::from("/srv/ckpt"));
        assert_eq!(
            root.dir_for("resnet-50_v2", JobId(3)),
            Path::new("/srv/ckpt/resnet-50_v2")
        );
        assert_eq!(
            root.dir_for("../../etc", JobId(3)),
            Path::new("/srv/ckpt/_.._etc")
        );
        assert_eq!(root.dir_for("..", JobId(3)), Path::new("/srv/ckpt/job-3"));
        assert_eq!(root.dir_for("", JobId(4)), Path::new("/srv/ckpt/job-4"));
        let shared = CheckpointRoot::Shared(PathBuf::from("/data"));
        assert_eq!(shared.dir_for("x", JobId(1)), Path::new("/data"));
    }

    #[test]
    fn graphs_are_checked_for_size_ops_and_library_checkpoints() {
        let rules = TenantRules {
            max_graph_bytes: 10,
            ..TenantRules::default()
        };
        let ops = BTreeSet::new();
        let mut library_ops = BTreeMap::new();
        assert!(rules.check_graph(10, &ops, &library_ops).is_ok());
        assert!(matches!(
            rules.check_graph(11, &ops, &library_ops),
            Err(Error::ResourceExhausted(_))
        ));
        library_ops.insert("WriteFile".into(), "f".into());
        let err = rules
            .check_graph(1, &ops, &library_ops)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("in the function library") && err.contains("WriteFile"),
            "{err}"
        );
        library_ops.clear();
        library_ops.insert("SaveV2".into(), "f".into());
        let err = rules
            .check_graph(1, &ops, &library_ops)
            .unwrap_err()
            .to_string();
        assert!(err.contains("op SaveV2 in function \"f\""), "{err}");
    }
}
