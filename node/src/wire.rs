//! Wire-level protobuf editing: removes top-level fields from a serialized
//! message while keeping every other byte as the client sent it. Used on the
//! client's ConfigProto, which the server hands to TensorFlow without a full
//! schema (decoding into a subset and re-encoding would drop fields).

/// Why a message could not be walked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated protobuf message")]
    Truncated,
    #[error("malformed varint in protobuf message")]
    BadVarint,
    #[error("unsupported protobuf wire type {0}")]
    BadWireType(u64),
}

fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos).ok_or(WireError::Truncated)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError::BadVarint)
}

/// Appends a varint.
pub fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A top-level field: its number and its full encoded span (key included).
struct Field {
    number: u64,
    start: usize,
    end: usize,
}

fn fields(bytes: &[u8]) -> Result<Vec<Field>, WireError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let start = pos;
        let key = read_varint(bytes, &mut pos)?;
        let len = match key & 7 {
            0 => {
                read_varint(bytes, &mut pos)?;
                0
            }
            1 => 8,
            2 => read_varint(bytes, &mut pos)?,
            5 => 4,
            other => return Err(WireError::BadWireType(other)),
        };
        let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
        pos = pos
            .checked_add(len)
            .filter(|&end| end <= bytes.len())
            .ok_or(WireError::Truncated)?;
        out.push(Field {
            number: key >> 3,
            start,
            end: pos,
        });
    }
    Ok(out)
}

/// `bytes` without the top-level fields numbered in `drop`.
pub fn strip_fields(bytes: &[u8], drop: &[u64]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(bytes.len());
    for field in fields(bytes)? {
        if !drop.contains(&field.number) {
            out.extend_from_slice(&bytes[field.start..field.end]);
        }
    }
    Ok(out)
}

/// `bytes` with the sub-fields `inner` removed from every top-level
/// length-delimited field numbered `outer` (one level of nesting).
pub fn strip_nested_fields(bytes: &[u8], outer: u64, inner: &[u64]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(bytes.len());
    for field in fields(bytes)? {
        let raw = &bytes[field.start..field.end];
        if field.number != outer {
            out.extend_from_slice(raw);
            continue;
        }
        // key, then length, then the nested message
        let mut pos = 0;
        let key = read_varint(raw, &mut pos)?;
        if key & 7 != 2 {
            out.extend_from_slice(raw);
            continue;
        }
        read_varint(raw, &mut pos)?;
        let nested = strip_fields(&raw[pos..], inner)?;
        write_varint(&mut out, key);
        write_varint(&mut out, nested.len() as u64);
        out.extend_from_slice(&nested);
    }
    Ok(out)
}

/// `bytes` with `rewrite` applied to the payload of every length-delimited
/// sub-field `inner` of every top-level length-delimited field `outer` (e.g. the
/// `device` of each `node_def` of a FunctionDef). `rewrite` returns `None` to
/// keep a payload; every other byte stays as it was.
pub fn rewrite_nested_fields(
    bytes: &[u8],
    outer: u64,
    inner: u64,
    rewrite: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(bytes.len());
    for field in fields(bytes)? {
        let raw = &bytes[field.start..field.end];
        let Some(payload) = length_delimited(raw, outer)? else {
            out.extend_from_slice(raw);
            continue;
        };
        let mut nested = Vec::with_capacity(payload.len());
        for sub in fields(payload)? {
            let sub_raw = &payload[sub.start..sub.end];
            match length_delimited(sub_raw, inner)?.and_then(|value| rewrite(value)) {
                Some(value) => {
                    write_varint(&mut nested, (inner << 3) | 2);
                    write_varint(&mut nested, value.len() as u64);
                    nested.extend_from_slice(&value);
                }
                None => nested.extend_from_slice(sub_raw),
            }
        }
        write_varint(&mut out, (outer << 3) | 2);
        write_varint(&mut out, nested.len() as u64);
        out.extend_from_slice(&nested);
    }
    Ok(out)
}

/// The payload of an encoded field (`raw`: key, length, payload) when it is
/// field `number` and length-delimited.
fn length_delimited(raw: &[u8], number: u64) -> Result<Option<&[u8]>, WireError> {
    let mut pos = 0;
    let key = read_varint(raw, &mut pos)?;
    if key >> 3 != number || key & 7 != 2 {
        return Ok(None);
    }
    read_varint(raw, &mut pos)?;
    Ok(Some(&raw[pos..]))
}

/// Whether a top-level field numbered `number` is present.
pub fn has_field(bytes: &[u8], number: u64) -> Result<bool, WireError> {
    Ok(fields(bytes)?.iter().any(|f| f.number == number))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_only_named_fields() {
        // field 1 (len 2 "ab"), field 2 varint 150, field 5 fixed32
        let msg = [0x0a, 0x02, b'a', b'b', 0x10, 0x96, 0x01, 0x2d, 1, 2, 3, 4];
        assert_eq!(
            strip_fields(&msg, &[1]).unwrap(),
            vec![0x10, 0x96, 0x01, 0x2d, 1, 2, 3, 4]
        );
        assert_eq!(
            strip_fields(&msg, &[2, 5]).unwrap(),
            vec![0x0a, 0x02, b'a', b'b']
        );
        assert_eq!(strip_fields(&msg, &[]).unwrap(), msg.to_vec());
        assert!(has_field(&msg, 5).unwrap());
        assert!(!has_field(&msg, 3).unwrap());
    }

    #[test]
    fn strips_nested_fields_only_inside_the_named_field() {
        // field 1 = "x"; field 16 = { field 11 = "ab", field 2 = 7 }; field 11 = 5 at the top stays.
        let inner = [0x5a, 0x02, b'a', b'b', 0x10, 0x07];
        let mut msg = vec![0x0a, 0x01, b'x', 0x82, 0x01, inner.len() as u8];
        msg.extend_from_slice(&inner);
        msg.extend_from_slice(&[0x58, 0x05]);
        let out = strip_nested_fields(&msg, 16, &[11]).unwrap();
        assert_eq!(
            out,
            vec![0x0a, 0x01, b'x', 0x82, 0x01, 0x02, 0x10, 0x07, 0x58, 0x05]
        );
        assert_eq!(
            strip_nested_fields(&[0x82, 0x01, 0x03, 0x5a], 16, &[11]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn rewrites_nested_fields_and_keeps_the_rest() {
        // field 3 = { field 1 = "n", field 4 = "dev" }, field 3 = { field 4 = "keep" }, field 1 = "x"
        let first = [0x0a, 0x01, b'n', 0x22, 0x03, b'd', b'e', b'v'];
        let second = [0x22, 0x04, b'k', b'e', b'e', b'p'];
        let mut msg = vec![0x1a, first.len() as u8];
        msg.extend_from_slice(&first);
        msg.extend_from_slice(&[0x1a, second.len() as u8]);
        msg.extend_from_slice(&second);
        msg.extend_from_slice(&[0x0a, 0x01, b'x']);
        let out = rewrite_nested_fields(&msg, 3, 4, &mut |v| {
            (v == b"dev").then(|| b"local".to_vec())
        })
        .unwrap();
        let first_out = [0x0a, 0x01, b'n', 0x22, 0x05, b'l', b'o', b'c', b'a', b'l'];
        let mut expected = vec![0x1a, first_out.len() as u8];
        expected.extend_from_slice(&first_out);
        expected.extend_from_slice(&[0x1a, second.len() as u8]);
        expected.extend_from_slice(&second);
        expected.extend_from_slice(&[0x0a, 0x01, b'x']);
        assert_eq!(out, expected);
        assert_eq!(
            rewrite_nested_fields(&msg, 3, 4, &mut |_| None).unwrap(),
            msg
        );
        assert_eq!(
            rewrite_nested_fields(&[0x1a, 0x03, 0x22, 0x05, b'a'], 3, 4, &mut |_| None),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn rejects_malformed_messages() {
        assert_eq!(
            strip_fields(&[0x0a, 0x05, b'a'], &[]),
            Err(WireError::Truncated)
        );
        assert_eq!(strip_fields(&[0x0b], &[]), Err(WireError::BadWireType(3)));
        assert_eq!(strip_fields(&[0x08, 0xff], &[]), Err(WireError::Truncated));
        assert_eq!(strip_fields(&[0x08; 1][..], &[]), Err(WireError::Truncated));
        let long = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(strip_fields(&long, &[]), Err(WireError::BadVarint));
        // A length that overflows usize arithmetic must not panic.
        let huge = [
            0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(strip_fields(&huge, &[]), Err(WireError::Truncated));
    }

    #[test]
    fn varint_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut buf = Vec::new();
            write_varint(&mut buf, v);
            let mut pos = 0;
            assert_eq!(read_varint(&buf, &mut pos).unwrap(), v);
            assert_eq!(pos, buf.len());
        }
    }
}
