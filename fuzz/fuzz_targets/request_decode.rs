//! Fuzzes what the server does with a MasterService request body before any
//! session is involved.
//!
//! The first input byte picks the request type (modulo 10, in the order of
//! [`Kind`]); the rest is the message body, decoded with prost exactly as the
//! gRPC codec does. Then the handlers' own pure checks run on the decoded
//! fields (see `server/src/frontend/master/mod.rs` and `server/src/runtime/graph_job.rs`):
//! - CreateSession: `session_config` on the ConfigProto bytes (with and without
//!   server defaults and GPU lanes), `Hints::parse` on the session metadata
//!   name, the job's checkpoint directory, `check_delta` of the GraphDef against
//!   a fresh `Graph` and `TenantRules::check_graph`;
//! - ExtendSession: `check_delta` against a graph that already holds a few
//!   nodes (so references to existing nodes are resolved), then `check_graph`;
//! - RunStep / RunCallable: every feed through `Tensor::from_proto` with a
//!   small byte limit, the run's `RunKey`, and the wire look-ups `Job::run`
//!   does on the RunOptions bytes;
//! - MakeCallable: the CallableOptions checks and its RunOptions bytes;
//! - the rest: decoding only.
//!
//! Every error goes through the one `Error` -> `tonic::Status` mapping and is
//! rendered as the HTTP response tonic would send.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use salus_proto::tensorflow::{
    attr_value, AttrValue, CallableOptions, CloseSessionRequest, ConfigProtoView,
    CreateSessionRequest, DataType, ExtendSessionRequest, GraphDef, ListDevicesRequest,
    MakeCallableRequest, NodeDef, PartialRunSetupRequest, ReleaseCallableRequest, ResetRequest,
    RunCallableRequest, RunStepRequest, TensorProto, TensorShapeProto,
};
use salus_server::error::Error;
use salus_server::runtime::graph_delta::{check_delta, CheckedDelta};
use salus_server::runtime::graph_job::RunKey;
use salus_server::runtime::session_config::{session_config, GpuLanes, SessionDefaults};
use salus_server::sched::{Hints, JobId};
use salus_server::tenant::{CheckpointRoot, TenantRules};
use salus_server::tf::{Graph, ImportMappings, Tensor};
use salus_server::wire;

/// Largest tensor a feed may create here (the server's default is 2 GiB): a
/// proto claiming more must be refused before anything is allocated.
const TENSOR_LIMIT: u64 = 1 << 20;

/// RunOptions fields `Job::run` looks for: trace_level (1), inter_op_thread_pool (3).
const RUN_OPTIONS_FIELDS: [u64; 2] = [1, 3];

/// ConfigProto fields `session_config` must drop: the client's devices and
/// cluster (1, 4, 13, 14, 17).
const CLIENT_ONLY_FIELDS: [u64; 5] = [1, 4, 13, 14, 17];

#[derive(Clone, Copy, Debug)]
enum Kind {
    CreateSession,
    ExtendSession,
    RunStep,
    MakeCallable,
    RunCallable,
    PartialRunSetup,
    CloseSession,
    ListDevices,
    Reset,
    ReleaseCallable,
}

const KINDS: [Kind; 10] = [
    Kind::CreateSession,
    Kind::ExtendSession,
    Kind::RunStep,
    Kind::MakeCallable,
    Kind::RunCallable,
    Kind::PartialRunSetup,
    Kind::CloseSession,
    Kind::ListDevices,
    Kind::Reset,
    Kind::ReleaseCallable,
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    // tonic hands the codec a contiguous buffer; prost copies `bytes` fields
    // out of it as `Bytes`, like here.
    let body = Bytes::copy_from_slice(body);
    match KINDS[usize::from(selector) % KINDS.len()] {
        Kind::CreateSession => {
            if let Ok(req) = CreateSessionRequest::decode(body) {
                create_session(&req);
            }
        }
        Kind::ExtendSession => {
            if let Ok(req) = ExtendSessionRequest::decode(body) {
                let delta = check_delta(&req.graph_def, existing_graph()).map_err(Error::from);
                report(delta.and_then(|d| checked_graph(&req.graph_def, d, existing_graph())));
            }
        }
        Kind::RunStep => {
            if let Ok(req) = RunStepRequest::decode(body) {
                let feed_names: Vec<&str> = req.feed.iter().map(|f| f.name.as_str()).collect();
                let _ = RunKey::of_step(&feed_names, &req.fetch, &req.target);
                run_options(&req.options);
                for feed in &req.feed {
                    match &feed.tensor {
                        Some(proto) => feed_tensor(&feed.name, proto),
                        None => report::<()>(Err(Error::InvalidArgument(format!(
                            "feed {:?} carries no tensor",
                            feed.name
                        )))),
                    }
                }
            }
        }
        Kind::MakeCallable => {
            if let Ok(req) = MakeCallableRequest::decode(body) {
                let options: CallableOptions = req.options.unwrap_or_default();
                if !options.tensor_connection.is_empty() {
                    report::<()>(Err(Error::Unimplemented(
                        "CallableOptions.tensor_connection".into(),
                    )));
                }
                run_options(&options.run_options);
            }
        }
        Kind::RunCallable => {
            if let Ok(req) = RunCallableRequest::decode(body) {
                let _ = RunKey::of_callable(req.handle);
                for (i, proto) in req.feed.iter().enumerate() {
                    feed_tensor(&format!("feed {i}"), proto);
                }
            }
        }
        Kind::PartialRunSetup => drop(PartialRunSetupRequest::decode(body)),
        Kind::CloseSession => drop(CloseSessionRequest::decode(body)),
        Kind::ListDevices => drop(ListDevicesRequest::decode(body)),
        Kind::Reset => drop(ResetRequest::decode(body)),
        Kind::ReleaseCallable => drop(ReleaseCallableRequest::decode(body)),
    }
});

/// The pure part of `Master::create_session` and `Job::create`.
fn create_session(req: &CreateSessionRequest) {
    let lanes = SessionDefaults {
        intra_op_threads: 2,
        inter_op_threads: 3,
        gpu_lanes: Some(GpuLanes {
            count: 3,
            lane_bytes: 512 << 20,
        }),
    };
    let mut name = None;
    for defaults in [SessionDefaults::default(), lanes] {
        match session_config(&req.config, defaults) {
            Ok((config, metadata_name)) => {
                check_session_config(&config, defaults);
                name = Some(metadata_name);
            }
            Err(err) => report::<()>(Err(err)),
        }
    }
    let Some(name) = name else { return };
    let hints = match Hints::parse(&name) {
        Ok(hints) => hints,
        Err(err) => return report::<()>(Err(Error::from(err))),
    };
    // The job's checkpoint directory is always one entry right under the base.
    let base = Path::new("/srv/salus-checkpoints");
    let dir = CheckpointRoot::PerJob(base.to_path_buf()).dir_for(&hints.name, JobId(7));
    assert_eq!(dir.parent(), Some(base), "{:?} -> {dir:?}", hints.name);
    assert!(
        !matches!(
            dir.file_name().and_then(|n| n.to_str()),
            None | Some("." | "..")
        ),
        "{:?} -> {dir:?}",
        hints.name
    );
    if !req.graph_def.is_empty() {
        let graph = Graph::new();
        let delta = check_delta(&req.graph_def, &graph).map_err(Error::from);
        report(delta.and_then(|d| checked_graph(&req.graph_def, d, &graph)));
    }
}

/// What TensorFlow gets as the session's config must hold none of the client's
/// device fields and no session metadata, and carry the server's GPU lanes.
fn check_session_config(config: &[u8], defaults: SessionDefaults) {
    for field in CLIENT_ONLY_FIELDS {
        assert_eq!(wire::has_field(config, field), Ok(false), "field {field}");
    }
    let view = ConfigProtoView::decode(config).expect("the server's ConfigProto decodes");
    assert!(
        view.experimental.and_then(|e| e.session_metadata).is_none(),
        "session metadata reaches TensorFlow"
    );
    if let Some(lanes) = defaults.gpu_lanes {
        assert!(view.allow_soft_placement);
        let devices = view
            .gpu_options
            .and_then(|g| g.experimental)
            .map(|e| e.virtual_devices)
            .unwrap_or_default();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].memory_limit_mb.len(), lanes.count as usize);
    }
}

/// `TenantRules::check_graph` on a checked delta, plus what the delta promises.
fn checked_graph(bytes: &[u8], delta: CheckedDelta, graph: &Graph) -> Result<(), Error> {
    for (name, index, op) in &delta.mappings.data {
        assert_eq!(graph.operation(name), Some(*op));
        assert!((0..op.num_outputs()).contains(index), "{name}:{index}");
    }
    for (name, op) in &delta.mappings.control {
        assert_eq!(graph.operation(name), Some(*op));
    }
    assert!(delta.ops.len() <= delta.node_count);
    TenantRules::default().check_graph(bytes.len(), &delta.ops, &delta.library_ops)
}

/// A feed converted as `Job::feeds` does; a success must respect the limit.
fn feed_tensor(name: &str, proto: &TensorProto) {
    match Tensor::from_proto(proto, TENSOR_LIMIT) {
        Ok(tensor) => assert!(tensor.byte_size() <= TENSOR_LIMIT),
        Err(err) => report::<()>(Err(Error::tensor(name, err))),
    }
}

/// The wire look-ups `Job::run` does on RunOptions bytes, and the appends.
fn run_options(options: &[u8]) {
    for field in RUN_OPTIONS_FIELDS {
        match wire::has_field(options, field) {
            Ok(present) => {
                let mut edited = options.to_vec();
                if !present {
                    wire::write_varint(&mut edited, field << 3);
                    wire::write_varint(&mut edited, -1i64 as u64);
                }
                assert_eq!(wire::has_field(&edited, field), Ok(true));
            }
            Err(err) => report::<()>(Err(Error::from(err))),
        }
    }
}

/// Renders an error as the gRPC response the handler would send.
fn report<T>(result: Result<T, Error>) {
    if let Err(err) = result {
        let status = tonic::Status::from(err);
        drop(status.into_http::<()>());
    }
}

/// The graph ExtendSession deltas are checked against: a few nodes of an
/// earlier CreateSession (a placeholder "x", "y" = Identity(x), a resource
/// variable "v", and "init"), so deltas can reference existing nodes.
fn existing_graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(|| {
        let attr = |value| AttrValue { value: Some(value) };
        let float = || attr(attr_value::Value::Type(DataType::DtFloat as i32));
        let node = |name: &str, op: &str, input: &[&str], attrs: Vec<(&str, AttrValue)>| NodeDef {
            name: name.into(),
            op: op.into(),
            input: input.iter().map(|s| s.to_string()).collect(),
            attr: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        };
        let def = GraphDef {
            node: vec![
                node("x", "Placeholder", &[], vec![("dtype", float())]),
                node("y", "Identity", &["x"], vec![("T", float())]),
                node(
                    "v",
                    "VarHandleOp",
                    &[],
                    vec![
                        ("dtype", float()),
                        (
                            "shape",
                            attr(attr_value::Value::Shape(TensorShapeProto::default())),
                        ),
                    ],
                ),
                node("init", "NoOp", &["^v"], vec![]),
            ],
            ..Default::default()
        }
        .encode_to_vec();
        let graph = Graph::new();
        graph
            .import(&def, &ImportMappings::default(), None)
            .expect("the base graph imports");
        graph
    })
}
