//! Which TensorFlow ops a tenant's graph may contain.
//!
//! TensorFlow graphs are programs that run with the server's permissions. Ops
//! that reach the server's filesystem, network or processes are refused by
//! default, in the graph and in its function library, at CreateSession and
//! ExtendSession; `--allow-ops` and `--deny-ops` adjust the set. Checkpoint ops
//! (Save/Restore) are allowed but confined to the job's checkpoint directory
//! (see [`crate::tenant::checkpoint_guard`]).

use std::collections::BTreeSet;

use crate::error::Error;

/// Ops refused by default, with what they would do on the server.
pub const HOST_ACCESS_OPS: &[(&str, &str)] = &[
    ("ReadFile", "reads a file"),
    ("WriteFile", "writes a file"),
    ("MatchingFiles", "lists files"),
    ("MatchingFilesDataset", "lists files"),
    ("ImmutableConst", "maps a file into memory"),
    ("InitializeTableFromTextFile", "reads a file"),
    ("InitializeTableFromTextFileV2", "reads a file"),
    ("GenerateVocabRemapping", "reads files"),
    (
        "LoadAndRemapMatrix",
        "reads a checkpoint outside the job's directory",
    ),
    ("Skipgram", "reads a file"),
    ("DecodeProtoV2", "may read a descriptor file"),
    ("EncodeProto", "may read a descriptor file"),
    ("TFRecordReader", "reads files"),
    ("TFRecordReaderV2", "reads files"),
    ("FixedLengthRecordReader", "reads files"),
    ("FixedLengthRecordReaderV2", "reads files"),
    ("TextLineReader", "reads files"),
    ("TextLineReaderV2", "reads files"),
    ("WholeFileReader", "reads files"),
    ("WholeFileReaderV2", "reads files"),
    ("LMDBReader", "reads files"),
    ("TFRecordDataset", "reads files"),
    ("TFRecordDatasetV2", "reads files"),
    ("FixedLengthRecordDataset", "reads files"),
    ("FixedLengthRecordDatasetV2", "reads files"),
    ("TextLineDataset", "reads files"),
    ("CSVDataset", "reads files"),
    ("CSVDatasetV2", "reads files"),
    ("ExperimentalCSVDataset", "reads files"),
    ("SqlDataset", "opens a database"),
    ("ExperimentalSqlDataset", "opens a database"),
    ("LMDBDataset", "reads files"),
    ("ExperimentalLMDBDataset", "reads files"),
    ("CacheDataset", "writes a cache file"),
    ("CacheDatasetV2", "writes a cache file"),
    ("SnapshotDataset", "writes files"),
    ("SnapshotDatasetV2", "writes files"),
    ("SaveDataset", "writes files"),
    ("SaveDatasetV2", "writes files"),
    ("LoadDataset", "reads files"),
    ("DatasetToTFRecord", "writes a file"),
    ("ExperimentalDatasetToTFRecord", "writes a file"),
    ("CreateSummaryFileWriter", "writes files"),
    ("CreateSummaryDbWriter", "writes a database"),
    ("WriteSummary", "writes a summary file"),
    ("WriteScalarSummary", "writes a summary file"),
    ("WriteHistogramSummary", "writes a summary file"),
    ("WriteImageSummary", "writes a summary file"),
    ("WriteAudioSummary", "writes a summary file"),
    ("WriteGraphSummary", "writes a summary file"),
    ("WriteRawProtoSummary", "writes a summary file"),
    ("ImportEvent", "writes a summary file"),
    ("FlushSummaryWriter", "writes a summary file"),
    ("PrintV2", "may write to a file named by the graph"),
    ("DebugIdentity", "may write debug dumps"),
    ("DebugIdentityV2", "may write debug dumps"),
    ("DebugIdentityV3", "may write debug dumps"),
    ("DebugNanCount", "may write debug dumps"),
    ("DebugNumericSummary", "may write debug dumps"),
    ("DebugNumericSummaryV2", "may write debug dumps"),
    ("BigQueryReader", "opens network connections"),
    ("GcsConfigureCredentials", "configures cloud credentials"),
    ("GcsConfigureBlockCache", "configures cloud storage"),
];

/// Checkpoint ops and the inputs that name files: allowed, with those paths
/// confined to the job's checkpoint directory.
pub const CHECKPOINT_OPS: &[(&str, &[i32])] = &[
    ("SaveV2", &[0]),
    ("RestoreV2", &[0]),
    ("Save", &[0]),
    ("SaveSlices", &[0]),
    ("Restore", &[0]),
    ("RestoreSlice", &[0]),
    ("MergeV2Checkpoints", &[0, 1]),
];

/// The path inputs of `op`, if it is a checkpoint op.
pub fn checkpoint_path_inputs(op: &str) -> Option<&'static [i32]> {
    CHECKPOINT_OPS
        .iter()
        .find(|(name, _)| *name == op)
        .map(|(_, inputs)| *inputs)
}

/// The effective set of refused ops.
#[derive(Clone, Debug)]
pub struct OpPolicy {
    denied: BTreeSet<String>,
}

impl Default for OpPolicy {
    fn default() -> Self {
        OpPolicy::new(&[], &[])
    }
}

impl OpPolicy {
    /// The default set, less `allow`, plus `deny`.
    pub fn new(allow: &[String], deny: &[String]) -> OpPolicy {
        let mut denied: BTreeSet<String> = HOST_ACCESS_OPS
            .iter()
            .map(|(op, _)| op.to_string())
            .collect();
        for op in allow {
            denied.remove(op);
        }
        denied.extend(deny.iter().cloned());
        OpPolicy { denied }
    }

    pub fn is_denied(&self, op: &str) -> bool {
        self.denied.contains(op)
    }

    /// Refuses the first denied op, naming it and why.
    pub fn check<'a>(&self, ops: impl IntoIterator<Item = &'a str>) -> Result<(), Error> {
        for op in ops {
            if self.is_denied(op) {
                let why = HOST_ACCESS_OPS
                    .iter()
                    .find(|(name, _)| *name == op)
                    .map_or("refused by --deny-ops", |(_, why)| why);
                return Err(Error::PermissionDenied(format!(
                    "op {op} is not allowed on this server: it {why} on the server's machine \
                     (an operator can allow it with --allow-ops {op})"
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
    fn python_ops_are_not_denied() {
        // They run on the server with their Python in the script's process
        // (runtime::python_calls), for every tenant.
        for op in ["PyFunc", "PyFuncStateless", "EagerPyFunc"] {
            assert!(!OpPolicy::default().is_denied(op));
        }
    }

    #[test]
    fn host_access_ops_are_refused_by_name_and_flags_adjust_the_set() {
        let policy = OpPolicy::default();
        assert!(policy.check(["MatMul", "SaveV2", "RestoreV2"]).is_ok());
        let err = policy.check(["Const", "ReadFile"]).unwrap_err();
        assert!(matches!(err, Error::PermissionDenied(_)));
        assert!(
            err.to_string().contains("op ReadFile is not allowed"),
            "{err}"
        );
        assert!(err.to_string().contains("--allow-ops ReadFile"), "{err}");
        let adjusted = OpPolicy::new(&["ReadFile".into()], &["MatMul".into()]);
        assert!(adjusted.check(["ReadFile"]).is_ok());
        let err = adjusted.check(["MatMul"]).unwrap_err().to_string();
        assert!(err.contains("refused by --deny-ops"), "{err}");
        assert_eq!(
            checkpoint_path_inputs("MergeV2Checkpoints"),
            Some(&[0, 1][..])
        );
        assert_eq!(checkpoint_path_inputs("MatMul"), None);
    }
}
