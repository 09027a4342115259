//! The server's error type and its one mapping to gRPC / TensorFlow codes.

use salus_proto::tensorflow::error::Code as TfCode;

use crate::tf_types::{TensorError, TfError};
use crate::wire::WireError;

/// Every error a request can end with. Codes follow TensorFlow's (and gRPC's)
/// numbering, so a stock client raises the matching `tf.errors` class.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("session {0:?} not found: it was closed, reclaimed, or the server restarted")]
    SessionNotFound(String),
    #[error("eager context {0} not found: it was closed, reclaimed after its client went away, or the server restarted; reconnect (tf.config.experimental_connect_to_cluster) or restart the script")]
    ContextNotFound(u64),
    /// A session or context that died with this tenant's previous executor
    /// process (INTERNAL, as the calls in flight then: clients give up at once).
    #[error("{0}")]
    LostWithExecutor(String),
    /// An eager context ended while a request was using it.
    #[error("{0}")]
    ContextGone(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("invalid tensor {name:?}: {source}")]
    Tensor { name: String, source: TensorError },
    /// A [`GraphError`](crate::runtime::graph_delta::GraphError), converted
    /// where it is defined: boxed, so this module does not depend on the graph
    /// checker (which depends on the tenant modules, which use this one).
    #[error("{0}")]
    Graph(Box<dyn std::error::Error + Send + Sync>),
    #[error("invalid ConfigProto: {0}")]
    Config(#[from] WireError),
    #[error("graph version mismatch: session {handle:?} is at version {current}, the request extends version {requested}")]
    GraphVersion {
        handle: String,
        current: i64,
        requested: i64,
    },
    #[error("callable {handle} not found in session {session:?}: it was released or never made")]
    CallableNotFound { session: String, handle: i64 },
    #[error("partial run {0:?} not found: it finished, failed, or was never set up")]
    PartialRunNotFound(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The node or the executor cannot take the request now (drained for
    /// maintenance; no supervisor adopted the executor in time): why.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    IterationDropped(String),
    /// The server ended a wait of the client's that nothing could end.
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("invalid job hints: {0}")]
    Hints(#[from] crate::sched::HintError),
    #[error(transparent)]
    Tensorflow(#[from] TfError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn tensor(name: impl Into<String>, source: TensorError) -> Error {
        match source {
            TensorError::Tensorflow(err) => Error::Tensorflow(err),
            source => Error::Tensor {
                name: name.into(),
                source,
            },
        }
    }

    /// TensorFlow's status code for this error.
    pub fn code(&self) -> TfCode {
        match self {
            // TensorFlow's master answers ABORTED for unknown sessions; clients
            // treat it as "recreate the session".
            Error::SessionNotFound(_) | Error::ContextNotFound(_) | Error::ContextGone(_) => {
                TfCode::Aborted
            }
            Error::InvalidArgument(_)
            | Error::Tensor { .. }
            | Error::Graph(_)
            | Error::Config(_)
            | Error::CallableNotFound { .. }
            | Error::PartialRunNotFound(_) => TfCode::InvalidArgument,
            Error::GraphVersion { .. } => TfCode::FailedPrecondition,
            Error::Unimplemented(_) => TfCode::Unimplemented,
            Error::ShuttingDown | Error::Unavailable(_) => TfCode::Unavailable,
            Error::IterationDropped(_) | Error::Aborted(_) => TfCode::Aborted,
            Error::ResourceExhausted(_) => TfCode::ResourceExhausted,
            Error::PermissionDenied(_) => TfCode::PermissionDenied,
            Error::FailedPrecondition(_) => TfCode::FailedPrecondition,
            Error::Hints(_) => TfCode::InvalidArgument,
            Error::Tensorflow(err) => TfCode::try_from(err.code).unwrap_or(TfCode::Unknown),
            Error::Internal(_) | Error::LostWithExecutor(_) => TfCode::Internal,
        }
    }

    /// This error as a TensorFlow status: its code and message.
    pub fn to_tf_error(&self) -> TfError {
        TfError::new(self.code() as i32, self.to_string())
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> tonic::Status {
        tonic::Status::new(tonic::Code::from_i32(err.code() as i32), err.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_codes_like_tensorflow() {
        let cases: Vec<(Error, tonic::Code)> = vec![
            (Error::SessionNotFound("x".into()), tonic::Code::Aborted),
            (Error::LostWithExecutor("x".into()), tonic::Code::Internal),
            (
                Error::InvalidArgument("bad".into()),
                tonic::Code::InvalidArgument,
            ),
            (
                Error::tensor("x:0", TensorError::UnknownDtype(999)),
                tonic::Code::InvalidArgument,
            ),
            (
                Error::tensor("x:0", TensorError::Tensorflow(TfError::new(8, "oom"))),
                tonic::Code::ResourceExhausted,
            ),
            (
                Error::GraphVersion {
                    handle: "s".into(),
                    current: 2,
                    requested: 1,
                },
                tonic::Code::FailedPrecondition,
            ),
            (
                // What salus-server's GraphError converts into.
                Error::Graph("duplicate node \"a\"".into()),
                tonic::Code::InvalidArgument,
            ),
            (
                Error::Tensorflow(TfError::new(9, "uninitialized")),
                tonic::Code::FailedPrecondition,
            ),
            (
                Error::Tensorflow(TfError::new(77, "odd")),
                tonic::Code::Unknown,
            ),
            (
                Error::Unimplemented("no".into()),
                tonic::Code::Unimplemented,
            ),
            (Error::ShuttingDown, tonic::Code::Unavailable),
            (
                Error::Unavailable("draining".into()),
                tonic::Code::Unavailable,
            ),
        ];
        for (err, code) in cases {
            let message = err.to_string();
            let status = tonic::Status::from(err);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn tensor_errors_name_the_tensor() {
        let err = Error::tensor("input:0", TensorError::UnknownDtype(999));
        assert_eq!(
            err.to_string(),
            "invalid tensor \"input:0\": unknown dtype 999"
        );
    }
}
