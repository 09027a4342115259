//! ConfigProto bytes: reading the program's own session_metadata and appending the job's.
//!
//! Protobuf messages merge when concatenated (a repeated sub-message merges, a scalar's
//! last value wins), so the hints are added by appending one
//! `experimental { session_metadata { name version } }` field to the program's bytes,
//! never by decoding and re-encoding its config.

use crate::wire::{submessages, write_len_field, write_varint, MalformedProto, WIRE_VARINT};

/// ConfigProto.experimental (16) . session_metadata (11) . name (1) / version (2).
const EXPERIMENTAL_FIELD: u64 = 16;
const SESSION_METADATA_FIELD: u64 = 11;
const NAME_FIELD: u64 = 1;
const VERSION_FIELD: u64 = 2;

/// The program's own experimental.session_metadata.name, if it set a non-empty one.
pub fn session_metadata_name(config: &[u8]) -> Result<Option<String>, MalformedProto> {
    let mut name = None;
    for experimental in submessages(config, EXPERIMENTAL_FIELD)? {
        for metadata in submessages(experimental, SESSION_METADATA_FIELD)? {
            for value in submessages(metadata, NAME_FIELD)? {
                name = Some(String::from_utf8_lossy(value).into_owned()); // last one wins
            }
        }
    }
    Ok(name.filter(|n| !n.is_empty()))
}

/// The program's config with the job's session_metadata added, unless the program named
/// its session itself (its name then wins, as in the Python adapter).
pub fn with_job_metadata(
    config: &[u8],
    metadata_name: &str,
    version: i64,
) -> Result<Vec<u8>, MalformedProto> {
    let mut merged = config.to_vec();
    if session_metadata_name(config)?.is_some() {
        return Ok(merged);
    }
    let mut metadata = Vec::new();
    write_len_field(&mut metadata, NAME_FIELD, metadata_name.as_bytes());
    write_varint(&mut metadata, (VERSION_FIELD << 3) | u64::from(WIRE_VARINT));
    write_varint(&mut metadata, version as u64);
    let mut experimental = Vec::new();
    write_len_field(&mut experimental, SESSION_METADATA_FIELD, &metadata);
    write_len_field(&mut merged, EXPERIMENTAL_FIELD, &experimental);
    Ok(merged)
}

/// A random non-negative int64 for session_metadata.version: TensorFlow refuses two live
/// sessions with the same (name, version) in one process.
pub fn new_metadata_version() -> i64 {
    let mut raw = [0u8; 8];
    // SAFETY: getrandom writes at most raw.len() bytes into raw.
    let got = unsafe { libc::getrandom(raw.as_mut_ptr().cast(), raw.len(), 0) };
    let mut value = if got == raw.len() as isize {
        i64::from_le_bytes(raw) & i64::MAX
    } else {
        // No entropy source: time and pid still differ between concurrent processes.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        (nanos ^ (i64::from(std::process::id()) << 32)) & i64::MAX
    };
    if value == 0 {
        value = 1;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{fields, Field};

    /// ConfigProto{intra_op_parallelism_threads: 2, experimental{session_metadata{name}}}.
    fn config_with_name(name: &str) -> Vec<u8> {
        let mut meta = Vec::new();
        write_len_field(&mut meta, NAME_FIELD, name.as_bytes());
        let mut exp = Vec::new();
        write_len_field(&mut exp, SESSION_METADATA_FIELD, &meta);
        let mut cfg = vec![0x10, 0x02];
        write_len_field(&mut cfg, EXPERIMENTAL_FIELD, &exp);
        cfg
    }

    #[test]
    fn appends_metadata_to_empty_and_existing_configs() {
        let merged = with_job_metadata(&[], "job?priority=3", 7).unwrap();
        assert_eq!(
            session_metadata_name(&merged).unwrap().as_deref(),
            Some("job?priority=3")
        );
        // Field 16 is a two-byte key: 0x82 0x01.
        assert_eq!(&merged[..2], &[0x82, 0x01]);

        let own = [0x10, 0x04, 0x28, 0x03]; // intra = 4, inter = 3
        let merged = with_job_metadata(&own, "job", 1).unwrap();
        assert_eq!(
            &merged[..own.len()],
            &own,
            "the program's fields are kept as they were"
        );
        let numbers: Vec<u64> = fields(&merged).unwrap().iter().map(|f| f.number).collect();
        assert_eq!(numbers, vec![2, 5, 16]);
        let exp = submessages(&merged, EXPERIMENTAL_FIELD).unwrap();
        let meta = submessages(exp[0], SESSION_METADATA_FIELD).unwrap();
        let meta_fields = fields(meta[0]).unwrap();
        assert_eq!(meta_fields[0].bytes, Some(&b"job"[..]));
        assert_eq!(
            meta_fields[1],
            Field {
                number: VERSION_FIELD,
                bytes: None
            }
        );
    }

    #[test]
    fn the_programs_own_name_wins() {
        let own = config_with_name("mine");
        assert_eq!(with_job_metadata(&own, "job", 1).unwrap(), own);
        // An empty name is "unset": the hints are added.
        let empty = config_with_name("");
        let merged = with_job_metadata(&empty, "job", 1).unwrap();
        assert_eq!(
            session_metadata_name(&merged).unwrap().as_deref(),
            Some("job")
        );
    }

    #[test]
    fn later_occurrences_win_as_in_protobuf_merging() {
        let mut two = config_with_name("first");
        two.extend(config_with_name("second"));
        assert_eq!(
            session_metadata_name(&two).unwrap().as_deref(),
            Some("second")
        );
    }

    #[test]
    fn malformed_bytes_are_refused_not_panicked_on() {
        for bad in [
            &[0x82u8][..],
            &[0x82, 0x01, 0x05, 0x00],
            &[0x00],
            &[0x0b],
            &[0xff; 11],
            &[0x09, 1, 2],
        ] {
            assert_eq!(
                with_job_metadata(bad, "job", 1),
                Err(MalformedProto),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn versions_are_positive() {
        for _ in 0..100 {
            assert!(new_metadata_version() > 0);
        }
    }
}
