//! Turns a client's ConfigProto into the one the server's TF session gets.
//!
//! The client's config is applied where it makes sense (thread pools, graph and
//! optimizer options, timeouts) but never where it would hide or restrict the
//! server's devices: the stock client always sends its *own* `device_count`
//! (`{CPU: 1, GPU: 0}` on a CPU build), which says nothing about the server.

use prost::Message;
use salus_proto::tensorflow::ConfigProtoView;

use crate::error::{Error, Result};
use crate::wire;

/// ConfigProto fields describing the client's devices or cluster, dropped:
/// device_count (1), device_filters (4), rpc_options (13), cluster_def (14),
/// share_cluster_devices_in_session (17).
const CLIENT_ONLY_FIELDS: &[u64] = &[1, 4, 13, 14, 17];
const INTRA_OP_THREADS_FIELD: u64 = 2;
/// ConfigProto.experimental (16) . session_metadata (11): Salus's job hints.
/// TensorFlow refuses a second session with the same metadata in one process,
/// and every tenant's session lives in this one, so it never reaches TF.
const EXPERIMENTAL_FIELD: u64 = 16;
const SESSION_METADATA_FIELD: u64 = 11;
const INTER_OP_THREADS_FIELD: u64 = 5;

/// Server-side defaults for settings the client leaves unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionDefaults {
    /// 0 lets TensorFlow pick.
    pub intra_op_threads: u32,
    pub inter_op_threads: u32,
}

/// The ConfigProto for TensorFlow and the job's name (from
/// `experimental.session_metadata.name`, empty if unset).
pub fn session_config(client: &[u8], defaults: SessionDefaults) -> Result<(Vec<u8>, String)> {
    let view = ConfigProtoView::decode(client)
        .map_err(|e| Error::InvalidArgument(format!("invalid ConfigProto: {e}")))?;
    let config = wire::strip_fields(client, CLIENT_ONLY_FIELDS)?;
    let mut config =
        wire::strip_nested_fields(&config, EXPERIMENTAL_FIELD, &[SESSION_METADATA_FIELD])?;
    for (field, value) in [
        (INTRA_OP_THREADS_FIELD, defaults.intra_op_threads),
        (INTER_OP_THREADS_FIELD, defaults.inter_op_threads),
    ] {
        if value > 0 && !wire::has_field(&config, field)? {
            wire::write_varint(&mut config, field << 3);
            wire::write_varint(&mut config, u64::from(value));
        }
    }
    let name = view
        .experimental
        .and_then(|e| e.session_metadata)
        .map(|m| m.name)
        .unwrap_or_default();
    Ok((config, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use salus_proto::tensorflow::{config_proto_view, SessionMetadata};

    fn encode(intra: i32, name: &str) -> Vec<u8> {
        let mut bytes = Vec::new();
        // device_count {"CPU": 1}: map entry, field 1
        bytes.extend_from_slice(&[0x0a, 0x07, 0x0a, 0x03, b'C', b'P', b'U', 0x10, 0x01]);
        ConfigProtoView {
            intra_op_parallelism_threads: intra,
            inter_op_parallelism_threads: 0,
            experimental: Some(config_proto_view::Experimental {
                session_metadata: Some(SessionMetadata {
                    name: name.into(),
                    version: 0,
                }),
            }),
        }
        .encode(&mut bytes)
        .unwrap();
        bytes
    }

    #[test]
    fn drops_client_devices_and_keeps_the_rest() {
        let (config, name) =
            session_config(&encode(3, "job-a"), SessionDefaults::default()).unwrap();
        assert_eq!(name, "job-a");
        assert!(!wire::has_field(&config, 1).unwrap());
        let view = ConfigProtoView::decode(config.as_slice()).unwrap();
        assert_eq!(view.intra_op_parallelism_threads, 3);
    }

    #[test]
    fn server_defaults_fill_only_unset_fields() {
        let defaults = SessionDefaults {
            intra_op_threads: 2,
            inter_op_threads: 4,
        };
        let (config, _) = session_config(&encode(3, ""), defaults).unwrap();
        let view = ConfigProtoView::decode(config.as_slice()).unwrap();
        assert_eq!(
            (
                view.intra_op_parallelism_threads,
                view.inter_op_parallelism_threads
            ),
            (3, 4)
        );
        let (config, name) = session_config(&[], defaults).unwrap();
        let view = ConfigProtoView::decode(config.as_slice()).unwrap();
        assert_eq!(
            (
                view.intra_op_parallelism_threads,
                view.inter_op_parallelism_threads
            ),
            (2, 4)
        );
        assert_eq!(name, "");
    }

    #[test]
    fn malformed_config_is_invalid_argument() {
        let err = session_config(&[0x0a, 0x05], SessionDefaults::default()).unwrap_err();
        assert_eq!(
            err.code(),
            salus_proto::tensorflow::error::Code::InvalidArgument
        );
    }
}
