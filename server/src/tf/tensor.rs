//! Conversion between the wire's `TensorProto` and TensorFlow's `TF_Tensor`.
//!
//! Every proto is validated before anything is allocated: the dtype must be one a
//! script can feed, the shape fully defined and of at most TensorFlow's 254
//! dimensions (more makes `TF_AllocateTensor` abort the process), the element
//! count must not overflow,
//! the tensor must fit the configured byte limit (TensorFlow's "one typed value
//! fills the whole shape" rule lets a few-byte proto demand a huge tensor), and
//! `tensor_content` must match the shape exactly.
//!
//! Protos with `tensor_content` of a fixed-size dtype (what TensorFlow's own
//! client sends for numeric arrays) are copied straight into a fresh tensor.
//! Everything else (typed `*_val` fields; strings, which the stock client sends
//! as length-prefixed `tensor_content`) goes through `TF_TensorFromProto`, so
//! TensorFlow's own parsing rules apply.

use std::ffi::c_void;
use std::ptr::NonNull;

use bytes::Bytes;
use prost::Message;
use salus_proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use tensorflow_sys as sys;

use super::ffi;
use super::status::with_status;

pub use salus_node::tf_types::TensorError;

/// Element layout of a dtype that may cross the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DtypeInfo {
    pub dtype: DataType,
    pub name: &'static str,
    /// Bytes per element in `tensor_content`; `None` for strings.
    pub element_size: Option<u64>,
}

pub use salus_node::tf_types::MAX_RANK;

/// Size of TensorFlow's `TF_TString` (each string element of a tensor).
const TSTRING_SIZE: u64 = std::mem::size_of::<sys::TF_TString>() as u64;

/// A fully defined TensorShapeProto.
pub fn shape_proto(dims: Vec<i64>) -> TensorShapeProto {
    TensorShapeProto {
        dim: dims
            .into_iter()
            .map(|size| tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    }
}

/// Looks up a wire dtype number; resource, variant and reference types are refused.
pub fn dtype_info(raw: i32) -> Result<DtypeInfo, TensorError> {
    use DataType::*;
    let dtype = DataType::try_from(raw).map_err(|_| TensorError::UnknownDtype(raw))?;
    let size = match dtype {
        DtBool | DtInt8 | DtUint8 | DtQint8 | DtQuint8 => 1,
        DtInt16 | DtUint16 | DtHalf | DtBfloat16 | DtQint16 | DtQuint16 => 2,
        DtFloat | DtInt32 | DtUint32 | DtQint32 => 4,
        DtDouble | DtInt64 | DtUint64 | DtComplex64 => 8,
        DtComplex128 => 16,
        DtString => {
            return Ok(DtypeInfo {
                dtype,
                name: "string",
                element_size: None,
            })
        }
        DtResource => return Err(TensorError::UnsupportedDtype("resource")),
        DtVariant => return Err(TensorError::UnsupportedDtype("variant")),
        DtInvalid => return Err(TensorError::UnknownDtype(raw)),
        _ => return Err(TensorError::UnsupportedDtype(dtype.as_str_name())),
    };
    Ok(DtypeInfo {
        dtype,
        name: dtype_name(dtype),
        element_size: Some(size),
    })
}

/// TensorFlow's Python name of a dtype ("float32", "int64", ...).
fn dtype_name(dtype: DataType) -> &'static str {
    use DataType::*;
    match dtype {
        DtFloat => "float32",
        DtDouble => "float64",
        DtHalf => "float16",
        DtBfloat16 => "bfloat16",
        DtInt8 => "int8",
        DtInt16 => "int16",
        DtInt32 => "int32",
        DtInt64 => "int64",
        DtUint8 => "uint8",
        DtUint16 => "uint16",
        DtUint32 => "uint32",
        DtUint64 => "uint64",
        DtBool => "bool",
        DtString => "string",
        DtComplex64 => "complex64",
        DtComplex128 => "complex128",
        DtQint8 => "qint8",
        DtQuint8 => "quint8",
        DtQint16 => "qint16",
        DtQuint16 => "quint16",
        DtQint32 => "qint32",
        other => other.as_str_name(),
    }
}

/// Number of typed values the proto carries for its dtype (complex values count
/// as one per real/imaginary pair).
fn typed_value_count(proto: &TensorProto, dtype: DataType) -> usize {
    use DataType::*;
    match dtype {
        DtFloat => proto.float_val.len(),
        DtDouble => proto.double_val.len(),
        DtHalf | DtBfloat16 => proto.half_val.len(),
        DtInt8 | DtInt16 | DtInt32 | DtUint8 | DtUint16 | DtQint8 | DtQuint8 | DtQint16
        | DtQuint16 | DtQint32 => proto.int_val.len(),
        DtInt64 => proto.int64_val.len(),
        DtUint32 => proto.uint32_val.len(),
        DtUint64 => proto.uint64_val.len(),
        DtBool => proto.bool_val.len(),
        DtString => proto.string_val.len(),
        DtComplex64 => proto.scomplex_val.len().div_ceil(2),
        DtComplex128 => proto.dcomplex_val.len().div_ceil(2),
        _ => 0,
    }
}

/// Dimensions of a shape proto, validated, and their element count.
fn checked_shape(shape: Option<&TensorShapeProto>) -> Result<(Vec<i64>, u64), TensorError> {
    let Some(shape) = shape else {
        return Ok((Vec::new(), 1));
    };
    if shape.unknown_rank {
        return Err(TensorError::UnknownRank);
    }
    if shape.dim.len() > MAX_RANK {
        return Err(TensorError::TooManyDimensions {
            rank: shape.dim.len(),
        });
    }
    let dims: Vec<i64> = shape.dim.iter().map(|d| d.size).collect();
    let mut count: u64 = 1;
    for (index, &size) in dims.iter().enumerate() {
        if size < 0 {
            return Err(TensorError::NegativeDimension { index, size });
        }
        count = count
            .checked_mul(size as u64)
            .ok_or_else(|| TensorError::ElementCountOverflow { dims: dims.clone() })?;
    }
    Ok((dims, count))
}

/// An owned `TF_Tensor`.
pub struct Tensor(NonNull<sys::TF_Tensor>);

// SAFETY: a TF_Tensor has no thread affinity; ownership moves with the wrapper and
// shared access is read-only.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    /// Takes ownership of a tensor returned by TensorFlow.
    ///
    /// # Safety
    /// `ptr` must be a valid TF_Tensor owned by nobody else.
    pub unsafe fn from_raw(ptr: *mut sys::TF_Tensor) -> Option<Tensor> {
        NonNull::new(ptr).map(Tensor)
    }

    pub fn as_ptr(&self) -> *mut sys::TF_Tensor {
        self.0.as_ptr()
    }

    /// Validates `proto` and builds the tensor it describes; `max_bytes` bounds the
    /// memory the tensor may take.
    pub fn from_proto(proto: &TensorProto, max_bytes: u64) -> Result<Tensor, TensorError> {
        let info = dtype_info(proto.dtype)?;
        let (dims, count) = checked_shape(proto.tensor_shape.as_ref())?;
        let per_element = info.element_size.unwrap_or(TSTRING_SIZE);
        let bytes = count as u128 * per_element as u128;
        if bytes > max_bytes as u128 {
            return Err(TensorError::TooLarge {
                dtype: info.name,
                dims,
                bytes,
                limit: max_bytes,
            });
        }
        if let Some(size) = info
            .element_size
            .filter(|_| !proto.tensor_content.is_empty())
        {
            let expected = count * size;
            if proto.tensor_content.len() as u64 != expected {
                return Err(TensorError::ContentLength {
                    dtype: info.name,
                    dims,
                    expected,
                    actual: proto.tensor_content.len(),
                });
            }
            return Ok(Self::from_content(info.dtype, &dims, &proto.tensor_content));
        }
        let values = typed_value_count(proto, info.dtype);
        if values as u64 > count {
            return Err(TensorError::TooManyValues {
                dims,
                elements: count,
                values,
            });
        }
        Self::parse_with_tensorflow(proto)
    }

    /// Allocates a tensor and copies little-endian element bytes into it.
    fn from_content(dtype: DataType, dims: &[i64], content: &[u8]) -> Tensor {
        // SAFETY: `dtype` passed dtype_info, so it is one of TF_DataType's variants
        // (both are TensorFlow's numbering). dims points to dims.len() valid i64s;
        // the tensor owns exactly content.len() bytes (checked against the shape
        // by the caller), filled before anyone else sees it.
        unsafe {
            let ptr = sys::TF_AllocateTensor(
                std::mem::transmute::<i32, sys::TF_DataType>(dtype as i32),
                dims.as_ptr(),
                dims.len() as i32,
                content.len(),
            );
            let tensor = Tensor(NonNull::new(ptr).expect("TF_AllocateTensor returned null"));
            if !content.is_empty() {
                std::ptr::copy_nonoverlapping(
                    content.as_ptr(),
                    sys::TF_TensorData(ptr) as *mut u8,
                    content.len(),
                );
            }
            tensor
        }
    }

    fn parse_with_tensorflow(proto: &TensorProto) -> Result<Tensor, TensorError> {
        let encoded = proto.encode_to_vec();
        let buffer = sys::TF_Buffer {
            data: encoded.as_ptr() as *const c_void,
            length: encoded.len(),
            data_deallocator: None,
        };
        // SAFETY: a scalar placeholder tensor that TF_TensorFromProto replaces;
        // `buffer` borrows `encoded`, which outlives the call.
        unsafe {
            let ptr = sys::TF_AllocateTensor(sys::TF_FLOAT, std::ptr::null(), 0, 4);
            let tensor = Tensor(NonNull::new(ptr).expect("TF_AllocateTensor returned null"));
            with_status(|status| ffi::TF_TensorFromProto(&buffer, tensor.as_ptr(), status))?;
            Ok(tensor)
        }
    }

    pub fn dtype_raw(&self) -> i32 {
        // SAFETY: self owns a live tensor.
        unsafe { ffi::TF_TensorTypeRaw(self.as_ptr()) }
    }

    pub fn dims(&self) -> Vec<i64> {
        // SAFETY: self owns a live tensor; indices are below TF_NumDims.
        unsafe {
            let n = sys::TF_NumDims(self.as_ptr());
            (0..n).map(|i| sys::TF_Dim(self.as_ptr(), i)).collect()
        }
    }

    /// Bytes of the tensor's buffer.
    pub fn byte_size(&self) -> u64 {
        // A tensor without elements may have no buffer at all (TF_TensorFromProto
        // leaves none), which TF_TensorByteSize and TF_TensorData dereference.
        if self.element_count() == 0 {
            return 0;
        }
        // SAFETY: self owns a live tensor.
        unsafe { sys::TF_TensorByteSize(self.as_ptr()) as u64 }
    }

    pub fn element_count(&self) -> u64 {
        // SAFETY: self owns a live tensor.
        unsafe { sys::TF_TensorElementCount(self.as_ptr()) as u64 }
    }

    /// The raw element bytes (fixed-size dtypes).
    fn data(&self) -> &[u8] {
        if self.element_count() == 0 {
            return &[]; // maybe no buffer: see byte_size
        }
        // SAFETY: TF_TensorData points at TF_TensorByteSize bytes owned by the
        // tensor and not mutated while shared.
        unsafe {
            let len = sys::TF_TensorByteSize(self.as_ptr());
            let data = sys::TF_TensorData(self.as_ptr()) as *const u8;
            if len == 0 || data.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(data, len)
            }
        }
    }

    /// The string elements of a DT_STRING tensor.
    /// The elements of a string tensor (empty for other dtypes' callers to avoid).
    pub fn strings(&self) -> Vec<Bytes> {
        let count = self.element_count() as usize;
        if count == 0 {
            return Vec::new(); // maybe no buffer: see byte_size
        }
        // SAFETY: a DT_STRING tensor's data is an array of `count` initialised
        // TF_TStrings; each data pointer is valid for its size while the tensor lives.
        unsafe {
            let base = sys::TF_TensorData(self.as_ptr()) as *const sys::TF_TString;
            (0..count)
                .map(|i| {
                    let s = base.add(i);
                    let len = sys::TF_StringGetSize(s);
                    let data = sys::TF_StringGetDataPointer(s) as *const u8;
                    if len == 0 {
                        Bytes::new()
                    } else {
                        Bytes::copy_from_slice(std::slice::from_raw_parts(data, len))
                    }
                })
                .collect()
        }
    }

    /// Converts to the wire form the TF client expects: `tensor_content` for
    /// fixed-size dtypes (shared with the tensor, no copy), `string_val` for strings.
    pub fn into_proto(self) -> Result<TensorProto, TensorError> {
        let raw = self.dtype_raw();
        let info = dtype_info(raw).map_err(|_| {
            TensorError::NotFetchable(
                DataType::try_from(raw)
                    .map(|d| d.as_str_name())
                    .unwrap_or("unknown"),
            )
        })?;
        let tensor_shape = Some(shape_proto(self.dims()));
        let mut proto = TensorProto {
            dtype: raw,
            tensor_shape,
            ..Default::default()
        };
        if info.element_size.is_none() {
            proto.string_val = self.strings();
        } else if self.element_count() > 0 {
            proto.tensor_content = Bytes::from_owner(TensorBytes(self));
        }
        Ok(proto)
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: self owns the tensor and deletes it once.
        unsafe { sys::TF_DeleteTensor(self.as_ptr()) }
    }
}

/// Lets `Bytes` share a tensor's buffer until the response is written.
struct TensorBytes(Tensor);

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.data()
    }
}

#[cfg(test)]
mod tests;
