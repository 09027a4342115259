//! Round trips for every dtype a script can feed or fetch, TensorFlow's typed
//! value rules, and lying protos.

use super::*;

const LIMIT: u64 = 1 << 30;

fn shape(dims: &[i64]) -> Option<TensorShapeProto> {
    Some(TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    })
}

fn content_proto(dtype: DataType, dims: &[i64], content: Vec<u8>) -> TensorProto {
    TensorProto {
        dtype: dtype as i32,
        tensor_shape: shape(dims),
        tensor_content: content.into(),
        ..Default::default()
    }
}

fn round_trip(proto: &TensorProto) -> TensorProto {
    Tensor::from_proto(proto, LIMIT)
        .expect("from_proto")
        .into_proto()
        .expect("into_proto")
}

#[test]
fn every_fixed_size_dtype_round_trips_through_tensor_content() {
    use DataType::*;
    let cases = [
        (DtFloat, 4),
        (DtDouble, 8),
        (DtHalf, 2),
        (DtBfloat16, 2),
        (DtInt8, 1),
        (DtInt16, 2),
        (DtInt32, 4),
        (DtInt64, 8),
        (DtUint8, 1),
        (DtUint16, 2),
        (DtUint32, 4),
        (DtUint64, 8),
        (DtBool, 1),
        (DtComplex64, 8),
        (DtComplex128, 16),
    ];
    for (dtype, size) in cases {
        for dims in [&[2i64, 3][..], &[][..], &[0, 4][..], &[5][..]] {
            let count: i64 = dims.iter().product();
            let content: Vec<u8> = (0..count as usize * size)
                .map(|i| {
                    if dtype == DtBool {
                        (i % 2) as u8
                    } else {
                        (i * 7 + 3) as u8
                    }
                })
                .collect();
            let proto = content_proto(dtype, dims, content.clone());
            let back = round_trip(&proto);
            assert_eq!(back.dtype, dtype as i32, "{dtype:?}");
            assert_eq!(back.tensor_shape, shape(dims), "{dtype:?} {dims:?}");
            assert_eq!(
                back.tensor_content.as_ref(),
                content.as_slice(),
                "{dtype:?} {dims:?}"
            );
        }
    }
}

#[test]
fn strings_round_trip_including_empty_and_binary() {
    let values: Vec<Bytes> = vec![
        Bytes::from_static(b"hello"),
        Bytes::new(),
        Bytes::from_static(b"\xff\x00\xfe binary"),
        Bytes::from(vec![b'x'; 100]),
    ];
    let proto = TensorProto {
        dtype: DataType::DtString as i32,
        tensor_shape: shape(&[2, 2]),
        string_val: values.clone(),
        ..Default::default()
    };
    let back = round_trip(&proto);
    assert_eq!(back.dtype, DataType::DtString as i32);
    assert_eq!(back.tensor_shape, shape(&[2, 2]));
    assert_eq!(back.string_val, values);
    let scalar = TensorProto {
        dtype: DataType::DtString as i32,
        string_val: vec![Bytes::from_static(b"s")],
        ..Default::default()
    };
    assert_eq!(
        round_trip(&scalar).string_val,
        vec![Bytes::from_static(b"s")]
    );
}

fn floats(proto: &TensorProto) -> Vec<f32> {
    proto
        .tensor_content
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn typed_values_follow_tensorflow_fill_rules() {
    // One value fills the whole shape.
    let one = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[3]),
        float_val: vec![1.5],
        ..Default::default()
    };
    assert_eq!(floats(&round_trip(&one)), vec![1.5; 3]);
    // Fewer values than elements: the last one repeats.
    let some = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[4]),
        float_val: vec![1.0, 2.0],
        ..Default::default()
    };
    assert_eq!(floats(&round_trip(&some)), vec![1.0, 2.0, 2.0, 2.0]);
    // No values: zeros.
    let none = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[2]),
        ..Default::default()
    };
    assert_eq!(floats(&round_trip(&none)), vec![0.0; 2]);
    // Other typed fields.
    let ints = TensorProto {
        dtype: DataType::DtInt64 as i32,
        tensor_shape: shape(&[2]),
        int64_val: vec![-7, 9],
        ..Default::default()
    };
    let back = round_trip(&ints);
    let got: Vec<i64> = back
        .tensor_content
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, vec![-7, 9]);
    let int8 = TensorProto {
        dtype: DataType::DtInt8 as i32,
        tensor_shape: shape(&[3]),
        int_val: vec![-1, 2, 3],
        ..Default::default()
    };
    assert_eq!(round_trip(&int8).tensor_content.as_ref(), &[0xff, 2, 3]);
    let bools = TensorProto {
        dtype: DataType::DtBool as i32,
        tensor_shape: shape(&[2]),
        bool_val: vec![true, false],
        ..Default::default()
    };
    assert_eq!(round_trip(&bools).tensor_content.as_ref(), &[1, 0]);
    let half = TensorProto {
        dtype: DataType::DtHalf as i32,
        half_val: vec![0x3c00],
        ..Default::default()
    };
    assert_eq!(round_trip(&half).tensor_content.as_ref(), &[0x00, 0x3c]);
    let c64 = TensorProto {
        dtype: DataType::DtComplex64 as i32,
        scomplex_val: vec![1.0, -2.0],
        ..Default::default()
    };
    assert_eq!(floats(&round_trip(&c64)), vec![1.0, -2.0]);
    let u64s = TensorProto {
        dtype: DataType::DtUint64 as i32,
        uint64_val: vec![u64::MAX],
        ..Default::default()
    };
    assert_eq!(round_trip(&u64s).tensor_content.as_ref(), &[0xff; 8]);
}

#[test]
fn lying_protos_are_rejected_before_allocation() {
    let huge_fill = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[1_000_000, 1_000_000]),
        float_val: vec![1.0],
        ..Default::default()
    };
    assert!(matches!(
        Tensor::from_proto(&huge_fill, LIMIT),
        Err(TensorError::TooLarge { .. })
    ));

    let overflow = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[i64::MAX, 4]),
        ..Default::default()
    };
    assert!(matches!(
        Tensor::from_proto(&overflow, LIMIT),
        Err(TensorError::ElementCountOverflow { .. })
    ));

    let negative = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[2, -1]),
        ..Default::default()
    };
    assert_eq!(
        Tensor::from_proto(&negative, LIMIT).err(),
        Some(TensorError::NegativeDimension { index: 1, size: -1 })
    );

    let short = content_proto(DataType::DtFloat, &[4], vec![0; 12]);
    assert!(matches!(
        Tensor::from_proto(&short, LIMIT),
        Err(TensorError::ContentLength {
            expected: 16,
            actual: 12,
            ..
        })
    ));
    let long = content_proto(DataType::DtInt64, &[1], vec![0; 9]);
    assert!(matches!(
        Tensor::from_proto(&long, LIMIT),
        Err(TensorError::ContentLength { .. })
    ));

    let unknown = TensorProto {
        dtype: 9999,
        ..Default::default()
    };
    assert_eq!(
        Tensor::from_proto(&unknown, LIMIT).err(),
        Some(TensorError::UnknownDtype(9999))
    );
    let invalid = TensorProto {
        dtype: 0,
        ..Default::default()
    };
    assert_eq!(
        Tensor::from_proto(&invalid, LIMIT).err(),
        Some(TensorError::UnknownDtype(0))
    );
    let resource = TensorProto {
        dtype: DataType::DtResource as i32,
        ..Default::default()
    };
    assert!(matches!(
        Tensor::from_proto(&resource, LIMIT),
        Err(TensorError::UnsupportedDtype(_))
    ));
    let reference = TensorProto {
        dtype: 101,
        ..Default::default()
    };
    assert_eq!(
        Tensor::from_proto(&reference, LIMIT).err(),
        Some(TensorError::UnknownDtype(101))
    );

    let too_many = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(&[2]),
        float_val: vec![1.0; 3],
        ..Default::default()
    };
    assert!(matches!(
        Tensor::from_proto(&too_many, LIMIT),
        Err(TensorError::TooManyValues { .. })
    ));
    let strings = TensorProto {
        dtype: DataType::DtString as i32,
        tensor_shape: shape(&[1 << 40]),
        string_val: vec![Bytes::from_static(b"x")],
        ..Default::default()
    };
    assert!(matches!(
        Tensor::from_proto(&strings, LIMIT),
        Err(TensorError::TooLarge { .. })
    ));

    let unknown_rank = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![],
            unknown_rank: true,
        }),
        ..Default::default()
    };
    assert_eq!(
        Tensor::from_proto(&unknown_rank, LIMIT).err(),
        Some(TensorError::UnknownRank)
    );

    // Exactly at the limit is fine; one byte over is not.
    let at_limit = content_proto(DataType::DtUint8, &[16], vec![0; 16]);
    assert!(Tensor::from_proto(&at_limit, 16).is_ok());
    assert!(matches!(
        Tensor::from_proto(&at_limit, 15),
        Err(TensorError::TooLarge { .. })
    ));
}

#[test]
fn tensors_without_elements_are_safe_to_measure_and_fetch() {
    // Found by fuzzing (fuzz/, target tensor_proto): TF_TensorFromProto leaves a
    // tensor without elements without a buffer, and TF_TensorByteSize /
    // TF_TensorData then dereference null. The stock client sends an empty
    // batch just so (no tensor_content), and the server measures fed bytes.
    use DataType::*;
    for (dtype, dims) in [
        (DtFloat, &[0i64, 3][..]),
        (DtInt64, &[4, 0][..]),
        (DtString, &[0][..]),
        (DtString, &[0, 1 << 20][..]),
    ] {
        let proto = TensorProto {
            dtype: dtype as i32,
            tensor_shape: shape(dims),
            ..Default::default()
        };
        let tensor = Tensor::from_proto(&proto, LIMIT).expect("from_proto");
        assert_eq!(tensor.element_count(), 0, "{dtype:?} {dims:?}");
        assert_eq!(tensor.byte_size(), 0, "{dtype:?} {dims:?}");
        let back = tensor.into_proto().expect("into_proto");
        assert_eq!(back.tensor_shape, shape(dims), "{dtype:?} {dims:?}");
        assert!(back.tensor_content.is_empty() && back.string_val.is_empty());
    }
}

#[test]
fn shapes_over_tensorflows_rank_limit_are_rejected() {
    // TF_AllocateTensor aborts the whole process on a shape of more than 254
    // dimensions; a 1 KB feed must not be able to do that.
    let dims = vec![1i64; MAX_RANK + 1];
    let typed = TensorProto {
        dtype: DataType::DtUint8 as i32,
        tensor_shape: shape(&dims),
        ..Default::default()
    };
    for proto in [content_proto(DataType::DtUint8, &dims, vec![1]), typed] {
        assert_eq!(
            Tensor::from_proto(&proto, LIMIT).err(),
            Some(TensorError::TooManyDimensions { rank: MAX_RANK + 1 })
        );
    }
    let at_max = content_proto(DataType::DtUint8, &vec![1; MAX_RANK], vec![7]);
    assert_eq!(round_trip(&at_max).tensor_content.as_ref(), &[7]);
}
