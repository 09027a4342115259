//! Turns a client's ConfigProto into the one the server's TF session gets.
//!
//! The client's config is applied where it makes sense (thread pools, graph and
//! optimizer options, timeouts) but never where it would hide or restrict the
//! server's devices: the stock client always sends its *own* `device_count`
//! (`{CPU: 1, GPU: 0}` on a CPU build), which says nothing about the server.

use prost::Message;
use salus_proto::tensorflow::gpu_options_view::{experimental::VirtualDevices, Experimental};
use salus_proto::tensorflow::{ConfigProtoView, GpuOptionsView};

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
/// ConfigProto.gpu_options (6) and allow_soft_placement (7): the server's own
/// with GPU lanes.
const GPU_OPTIONS_FIELD: u64 = 6;
const ALLOW_SOFT_PLACEMENT_FIELD: u64 = 7;

/// Server-side defaults for settings the client leaves unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionDefaults {
    /// 0 lets TensorFlow pick.
    pub intra_op_threads: u32,
    pub inter_op_threads: u32,
    /// GPU lanes: every session gets the same virtual-device split.
    pub gpu_lanes: Option<GpuLanes>,
}

/// GPU 0 split into `count` TensorFlow virtual GPUs of `lane_bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLanes {
    pub count: u32,
    pub lane_bytes: u64,
}

impl GpuLanes {
    /// The device a lane's jobs are placed on.
    pub fn device(lane: u32) -> String {
        format!("/device:GPU:{lane}")
    }

    /// TensorFlow fixes virtual devices once per process, so every session's
    /// config must carry the same ones. Soft placement lets ops without a GPU
    /// kernel (strings, file I/O) fall back to the CPU.
    fn write_into(self, config: &mut Vec<u8>) -> Result<()> {
        let stripped =
            wire::strip_fields(config, &[GPU_OPTIONS_FIELD, ALLOW_SOFT_PLACEMENT_FIELD])?;
        *config = stripped;
        let limit_mb = self.lane_bytes as f64 / f64::from(1 << 20);
        ConfigProtoView {
            allow_soft_placement: true,
            gpu_options: Some(GpuOptionsView {
                experimental: Some(Experimental {
                    virtual_devices: vec![VirtualDevices {
                        memory_limit_mb: vec![limit_mb as f32; self.count as usize],
                    }],
                }),
            }),
            ..Default::default()
        }
        .encode(config)
        .map_err(|e| Error::Internal(format!("encoding GPU options: {e}")))
    }
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
    if let Some(gpu_lanes) = defaults.gpu_lanes {
        gpu_lanes.write_into(&mut config)?;
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
            allow_soft_placement: false,
            gpu_options: None,
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
            gpu_lanes: None,
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
    fn gpu_lanes_replace_the_clients_gpu_options_with_virtual_devices() {
        let mut client = encode(0, "job");
        ConfigProtoView {
            gpu_options: Some(GpuOptionsView {
                experimental: Some(Experimental {
                    virtual_devices: vec![VirtualDevices {
                        memory_limit_mb: vec![1.0],
                    }],
                }),
            }),
            ..Default::default()
        }
        .encode(&mut client)
        .unwrap();
        let defaults = SessionDefaults {
            gpu_lanes: Some(GpuLanes {
                count: 3,
                lane_bytes: 512 << 20,
            }),
            ..Default::default()
        };
        let (config, _) = session_config(&client, defaults).unwrap();
        let view = ConfigProtoView::decode(config.as_slice()).unwrap();
        assert!(view.allow_soft_placement);
        let devices = view
            .gpu_options
            .unwrap()
            .experimental
            .unwrap()
            .virtual_devices;
        assert_eq!(devices.len(), 1, "one physical GPU");
        assert_eq!(devices[0].memory_limit_mb, [512.0; 3]);
        assert_eq!(GpuLanes::device(2), "/device:GPU:2");
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
