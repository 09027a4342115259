//! TensorFlow's values as plain data, without TensorFlow: its errors (a
//! status's code and message, a tensor's refusal) and a device as it lists
//! it. The error type carries them and the supervisor reads them from its
//! executors; salus-server's `tf` bindings make them from TensorFlow's calls
//! and re-export them.

/// An error reported by TensorFlow itself, with TensorFlow's status code
/// (the numbering of `tensorflow.error.Code` and gRPC).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TfError {
    pub code: i32,
    pub message: String,
}

impl TfError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        TfError {
            code,
            message: message.into(),
        }
    }
}

/// Most dimensions a TensorFlow shape may have (`TensorShape::MaxDimensions()`);
/// `TF_AllocateTensor` CHECK-fails, aborting the process, on more.
pub const MAX_RANK: usize = 254;

/// Why a tensor could not be converted. All are the client's fault
/// (INVALID_ARGUMENT) except `Tensorflow`, which carries TF's own code.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    #[error("unknown dtype {0}")]
    UnknownDtype(i32),
    #[error(
        "dtype {0} cannot be sent to the server: a resource or variant stands for state in the process that \
         made it (a tf.data dataset or iterator of the client's own process, such as one whose pipeline \
         calls Python, cannot be passed to a function on the server: iterate it in the client and pass \
         the batches as arguments)"
    )]
    UnsupportedDtype(&'static str),
    #[error("tensor shape has unknown rank; a fed tensor needs a fully defined shape")]
    UnknownRank,
    #[error("tensor shape has {rank} dimensions; TensorFlow allows at most {MAX_RANK}")]
    TooManyDimensions { rank: usize },
    #[error("tensor shape dimension {index} has size {size}; sizes must be >= 0")]
    NegativeDimension { index: usize, size: i64 },
    #[error("tensor shape {dims:?} has more elements than can be counted")]
    ElementCountOverflow { dims: Vec<i64> },
    #[error("tensor of dtype {dtype} and shape {dims:?} needs {bytes} bytes, over the limit of {limit} bytes")]
    TooLarge {
        dtype: &'static str,
        dims: Vec<i64>,
        bytes: u128,
        limit: u64,
    },
    #[error(
        "tensor_content holds {actual} bytes but dtype {dtype} and shape {dims:?} need {expected}"
    )]
    ContentLength {
        dtype: &'static str,
        dims: Vec<i64>,
        expected: u64,
        actual: usize,
    },
    #[error(
        "tensor of shape {dims:?} has {elements} elements but the proto carries {values} values"
    )]
    TooManyValues {
        dims: Vec<i64>,
        elements: u64,
        values: usize,
    },
    #[error("tensor of dtype {0} cannot be returned to the client")]
    NotFetchable(&'static str),
    #[error("{0}")]
    Tensorflow(#[from] TfError),
}

/// A device as TensorFlow lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub device_type: String,
    pub memory_bytes: i64,
    pub incarnation: u64,
}
