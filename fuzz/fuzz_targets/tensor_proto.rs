//! Fuzzes TensorProto -> TF_Tensor -> TensorProto conversion (`server/src/tf/tensor.rs`).
//!
//! The input is a serialized `TensorProto`, as a feed carries it. `from_proto`
//! runs with a 1 MiB limit: a proto that claims a larger tensor (a few bytes
//! can claim terabytes through the shape) must be refused before anything is
//! allocated, which libFuzzer's `-malloc_limit_mb` and `-rss_limit_mb` watch.
//! A tensor that was built must convert back with the same dtype and shape,
//! and the converted proto must convert again to the same tensor.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use salus_proto::tensorflow::TensorProto;
use salus_server::error::Error;
use salus_server::tf::Tensor;

const LIMIT: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(proto) = TensorProto::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let tensor = match Tensor::from_proto(&proto, LIMIT) {
        Ok(tensor) => tensor,
        Err(err) => {
            // What the client would get back.
            let status = tonic::Status::from(Error::tensor("x:0", err));
            drop(status.into_http::<()>());
            return;
        }
    };
    let dims: Vec<i64> = proto
        .tensor_shape
        .as_ref()
        .map(|s| s.dim.iter().map(|d| d.size).collect())
        .unwrap_or_default();
    assert_eq!(tensor.dtype_raw(), proto.dtype);
    assert_eq!(tensor.dims(), dims);
    assert!(tensor.byte_size() <= LIMIT, "{} bytes", tensor.byte_size());
    let elements = tensor.element_count();

    let back = tensor
        .into_proto()
        .expect("a tensor built from a proto converts back");
    assert_eq!(back.dtype, proto.dtype);
    let back_dims: Vec<i64> = back
        .tensor_shape
        .as_ref()
        .map(|s| s.dim.iter().map(|d| d.size).collect())
        .unwrap_or_default();
    assert_eq!(back_dims, dims);
    // Numeric content sent as tensor_content comes back byte for byte.
    if !proto.tensor_content.is_empty() && !back.tensor_content.is_empty() {
        assert_eq!(back.tensor_content, proto.tensor_content);
    }

    let again = Tensor::from_proto(&back, LIMIT).expect("a fetched tensor can be fed back");
    assert_eq!(again.dtype_raw(), proto.dtype);
    assert_eq!(again.dims(), dims);
    assert_eq!(again.element_count(), elements);
    let twice = again.into_proto().expect("converts back again");
    assert_eq!(twice.tensor_content, back.tensor_content);
    assert_eq!(twice.string_val, back.string_val);
});
