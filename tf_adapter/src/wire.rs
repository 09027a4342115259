//! Just enough of the protobuf wire format to read a few fields of TensorFlow's messages
//! (ConfigProto, MetaGraphDef) and to append new ones, without their schemas.

pub const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;

/// Bytes that are not a protobuf message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedProto;

/// One field of a message: its number and, for length-delimited fields, the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u64,
    /// `Some` for length-delimited fields (strings, bytes, sub-messages, packed arrays).
    pub bytes: Option<&'a [u8]>,
}

pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, MalformedProto> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or(MalformedProto)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(MalformedProto)
}

/// The fields of a message, in wire order (a field may repeat).
pub fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, MalformedProto> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        let number = key >> 3;
        if number == 0 {
            return Err(MalformedProto);
        }
        let bytes = match (key & 7) as u8 {
            WIRE_VARINT => {
                read_varint(buf, &mut pos)?;
                None
            }
            WIRE_FIXED64 => {
                pos = pos
                    .checked_add(8)
                    .filter(|&p| p <= buf.len())
                    .ok_or(MalformedProto)?;
                None
            }
            WIRE_FIXED32 => {
                pos = pos
                    .checked_add(4)
                    .filter(|&p| p <= buf.len())
                    .ok_or(MalformedProto)?;
                None
            }
            WIRE_LEN => {
                let len =
                    usize::try_from(read_varint(buf, &mut pos)?).map_err(|_| MalformedProto)?;
                let end = pos
                    .checked_add(len)
                    .filter(|&e| e <= buf.len())
                    .ok_or(MalformedProto)?;
                let payload = &buf[pos..end];
                pos = end;
                Some(payload)
            }
            _ => return Err(MalformedProto),
        };
        out.push(Field { number, bytes });
    }
    Ok(out)
}

/// Every occurrence of sub-message `number` in `buf` (they merge into one message).
pub fn submessages(buf: &[u8], number: u64) -> Result<Vec<&[u8]>, MalformedProto> {
    Ok(fields(buf)?
        .into_iter()
        .filter(|f| f.number == number)
        .filter_map(|f| f.bytes)
        .collect())
}

pub fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub fn write_len_field(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    write_varint(out, (number << 3) | u64::from(WIRE_LEN));
    write_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}
