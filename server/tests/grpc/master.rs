//! Starts the real server on port 0 and drives it with a gRPC client, the way
//! TensorFlow's own client does.

use crate::common::{float_vector, floats};

use std::collections::HashMap;

use prost::Message;
use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::{
    GetServerInfoRequest, GetStatsRequest, GetTimelineRequest, JobHintsUpdate, ListJobsRequest,
    SetJobHintsRequest, SetPolicyRequest,
};
use salus_proto::tensorflow::master_service_client::MasterServiceClient;
use salus_proto::tensorflow::*;
use salus_server::config::Config;
use tonic::transport::Channel;
use tonic::Code;

fn attr_type(dtype: DataType) -> AttrValue {
    AttrValue {
        value: Some(attr_value::Value::Type(dtype as i32)),
    }
}

fn float_scalar(value: f32) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        float_val: vec![value],
        tensor_shape: Some(Default::default()),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], attrs: Vec<(&str, AttrValue)>) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        device: String::new(),
        attr: attrs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
    }
}

fn graph(nodes: Vec<NodeDef>) -> bytes::Bytes {
    GraphDef {
        node: nodes,
        ..Default::default()
    }
    .encode_to_vec()
    .into()
}

/// x (placeholder) * two (const) -> y
fn base_graph() -> bytes::Bytes {
    graph(vec![
        node(
            "x",
            "Placeholder",
            &[],
            vec![("dtype", attr_type(DataType::DtFloat))],
        ),
        node(
            "two",
            "Const",
            &[],
            vec![
                ("dtype", attr_type(DataType::DtFloat)),
                (
                    "value",
                    AttrValue {
                        value: Some(attr_value::Value::Tensor(float_scalar(2.0))),
                    },
                ),
            ],
        ),
        node(
            "y",
            "Mul",
            &["x", "two"],
            vec![("T", attr_type(DataType::DtFloat))],
        ),
    ])
}

struct TestServer {
    master: MasterServiceClient<Channel>,
    admin: AdminClient<Channel>,
    server: crate::common::Running,
}

async fn start() -> TestServer {
    start_with(Config::default()).await
}

async fn start_with(config: Config) -> TestServer {
    let server = crate::common::Running::start(config).await;
    TestServer {
        master: MasterServiceClient::new(server.channel.clone()),
        admin: AdminClient::new(server.channel.clone()),
        server,
    }
}

impl TestServer {
    async fn close(&mut self, handle: &str) {
        self.master
            .close_session(CloseSessionRequest {
                session_handle: handle.into(),
            })
            .await
            .unwrap();
    }

    async fn server_info(&mut self) -> salus_proto::salus::v1::ServerInfo {
        self.admin
            .get_server_info(GetServerInfoRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    async fn jobs(&mut self) -> Vec<salus_proto::salus::v1::JobInfo> {
        self.admin
            .list_jobs(ListJobsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs
    }

    async fn shutdown(self) {
        drop(self.master);
        drop(self.admin);
        self.server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_protocol_end_to_end() {
    let mut s = start().await;

    // CreateSession with an empty graph, then extend it.
    let created = s
        .master
        .create_session(CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let handle = created.session_handle.clone();
    assert_eq!(created.graph_version, 0);
    let v1 = s
        .master
        .extend_session(ExtendSessionRequest {
            session_handle: handle.clone(),
            graph_def: base_graph(),
            current_graph_version: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .new_graph_version;
    assert_eq!(v1, 1);

    // A stale graph version is FAILED_PRECONDITION.
    let stale = s
        .master
        .extend_session(ExtendSessionRequest {
            session_handle: handle.clone(),
            graph_def: graph(vec![]),
            current_graph_version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");

    // A duplicate node name is INVALID_ARGUMENT.
    let dup = s
        .master
        .extend_session(ExtendSessionRequest {
            session_handle: handle.clone(),
            graph_def: graph(vec![node("y", "NoOp", &[], vec![])]),
            current_graph_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::InvalidArgument);
    assert!(
        dup.message().contains("duplicate node name \"y\""),
        "{}",
        dup.message()
    );

    // A delta that references existing nodes by data and control input.
    let delta = graph(vec![
        node(
            "z",
            "AddV2",
            &["y:0", "two", "^x"],
            vec![("T", attr_type(DataType::DtFloat))],
        ),
        node("done", "NoOp", &["^z"], vec![]),
    ]);
    let v2 = s
        .master
        .extend_session(ExtendSessionRequest {
            session_handle: handle.clone(),
            graph_def: delta,
            current_graph_version: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .new_graph_version;
    assert_eq!(v2, 2);

    // RunStep: fetch order as requested.
    let response = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(float_vector(&[1.0, 2.0])),
            }],
            fetch: vec!["z:0".into(), "y:0".into()],
            target: vec!["done".into()],
            store_errors_in_response_body: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.status_code, 0, "{}", response.status_error_message);
    assert_eq!(
        response
            .tensor
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["z:0", "y:0"]
    );
    assert_eq!(
        floats(response.tensor[0].tensor.as_ref().unwrap()),
        [4.0, 6.0]
    );
    assert_eq!(
        floats(response.tensor[1].tensor.as_ref().unwrap()),
        [2.0, 4.0]
    );

    // Runtime errors go in the body when asked, as a gRPC error otherwise.
    let missing_feed = RunStepRequest {
        session_handle: handle.clone(),
        fetch: vec!["y:0".into()],
        store_errors_in_response_body: true,
        ..Default::default()
    };
    let body = s
        .master
        .run_step(missing_feed.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        body.status_code,
        error::Code::InvalidArgument as i32,
        "{}",
        body.status_error_message
    );
    assert!(
        body.status_error_message.contains("x"),
        "{}",
        body.status_error_message
    );
    let err = s
        .master
        .run_step(RunStepRequest {
            store_errors_in_response_body: false,
            ..missing_feed
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let bad_fetch = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            fetch: vec!["nope:0".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        bad_fetch
            .message()
            .contains("\"nope:0\" names no operation"),
        "{}",
        bad_fetch.message()
    );

    // Callables: positional feeds.
    let callable = s
        .master
        .make_callable(MakeCallableRequest {
            session_handle: handle.clone(),
            options: Some(CallableOptions {
                feed: vec!["x:0".into()],
                fetch: vec!["z:0".into()],
                ..Default::default()
            }),
            request_id: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .handle;
    let out = s
        .master
        .run_callable(RunCallableRequest {
            session_handle: handle.clone(),
            handle: callable,
            feed: vec![float_vector(&[3.0])],
            request_id: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(floats(&out.fetch[0]), [8.0]);
    let wrong_count = s
        .master
        .run_callable(RunCallableRequest {
            session_handle: handle.clone(),
            handle: callable,
            feed: vec![],
            request_id: 3,
        })
        .await
        .unwrap_err();
    assert_eq!(wrong_count.code(), Code::InvalidArgument);
    s.master
        .release_callable(ReleaseCallableRequest {
            session_handle: handle.clone(),
            handle: callable,
        })
        .await
        .unwrap();
    let released = s
        .master
        .run_callable(RunCallableRequest {
            session_handle: handle.clone(),
            handle: callable,
            feed: vec![float_vector(&[3.0])],
            request_id: 4,
        })
        .await
        .unwrap_err();
    assert_eq!(released.code(), Code::InvalidArgument);

    // Partial runs.
    let prun = s
        .master
        .partial_run_setup(PartialRunSetupRequest {
            session_handle: handle.clone(),
            feed: vec!["x:0".into()],
            fetch: vec!["y:0".into(), "z:0".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .partial_run_handle;
    let step = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(float_vector(&[5.0])),
            }],
            fetch: vec!["y:0".into()],
            partial_run_handle: prun.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(floats(step.tensor[0].tensor.as_ref().unwrap()), [10.0]);
    let step = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            fetch: vec!["z:0".into()],
            partial_run_handle: prun,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(floats(step.tensor[0].tensor.as_ref().unwrap()), [12.0]);

    // Devices are the server's.
    let devices = s
        .master
        .list_devices(ListDevicesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        devices
            .local_device
            .iter()
            .any(|d| d.device_type == "CPU" && d.name.ends_with("device:CPU:0")),
        "{devices:?}"
    );

    // The admin API sees the session.
    let sessions = s.jobs().await;
    let info = sessions
        .iter()
        .find(|i| i.handle == handle)
        .expect("session listed");
    assert_eq!(info.graph_version, 2);
    assert_eq!(info.variables, 0);
    assert_eq!(info.graph_nodes, 5);
    assert!(info.runs_completed >= 3);
    let server_info = s.server_info().await;
    assert_eq!(server_info.open_sessions, 1);
    assert!(
        server_info.tensorflow_version.starts_with("2."),
        "{}",
        server_info.tensorflow_version
    );

    // Close twice; run after close; unknown handle.
    s.master
        .close_session(CloseSessionRequest {
            session_handle: handle.clone(),
        })
        .await
        .unwrap();
    let again = s
        .master
        .close_session(CloseSessionRequest {
            session_handle: handle.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::Aborted);
    let after = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            fetch: vec!["y:0".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(after.code(), Code::Aborted);
    assert!(after.message().contains("not found"), "{}", after.message());

    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_graphs_and_tensors_leave_the_server_healthy() {
    let mut s = start().await;
    // Malformed GraphDef bytes.
    let err = s
        .master
        .create_session(CreateSessionRequest {
            graph_def: vec![0x0a, 0xff, 0x01].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("not a valid GraphDef"),
        "{}",
        err.message()
    );
    // A dangling input.
    let err = s
        .master
        .create_session(CreateSessionRequest {
            graph_def: graph(vec![node(
                "a",
                "Identity",
                &["ghost"],
                vec![("T", attr_type(DataType::DtFloat))],
            )]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.message().contains("\"ghost\", which names no node"),
        "{}",
        err.message()
    );
    // An unknown op is TensorFlow's own error (NOT_FOUND), passed through.
    let err = s
        .master
        .create_session(CreateSessionRequest {
            graph_def: graph(vec![node("a", "NoSuchOp", &[], vec![])]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("NoSuchOp"), "{}", err.message());

    // A lying tensor.
    let handle = s
        .master
        .create_session(CreateSessionRequest {
            graph_def: base_graph(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_handle;
    let mut lying = float_vector(&[1.0, 2.0]);
    lying.tensor_shape.as_mut().unwrap().dim[0].size = 1 << 40;
    let err = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(lying),
            }],
            fetch: vec!["y:0".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("invalid tensor \"x:0\""),
        "{}",
        err.message()
    );

    // Still healthy: a normal run works.
    let ok = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(float_vector(&[1.5])),
            }],
            fetch: vec!["y".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(floats(ok.tensor[0].tensor.as_ref().unwrap()), [3.0]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_iterations_are_scheduled_and_visible_in_the_admin_api() {
    let mut s = start().await;
    // Hints travel in ConfigProto.experimental.session_metadata.name.
    let name = "trainer?priority=3&iterations=50";
    let handle = hinted_job(&mut s, name).await;
    for _ in 0..3 {
        let out = s
            .master
            .run_step(main_step(&handle))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(floats(out.tensor[0].tensor.as_ref().unwrap()), [2.0]);
    }
    let jobs = s.jobs().await;
    // A second job of the same name: TF itself refuses equal session metadata in
    // one process, so the server must not pass the hints on to it.
    let twin = hinted_job(&mut s, name).await;
    s.close(&twin).await;
    let job = jobs.iter().find(|j| j.handle == handle).unwrap();
    assert_eq!(job.name, "trainer");
    assert_eq!(job.iterations, 3, "{job:?}");
    assert!(job.attained_seconds > 0.0);
    assert!(
        job.service_seconds >= job.attained_seconds,
        "service counts main iterations and cheap runs: {job:?}"
    );
    assert_eq!(job.hints.as_ref().unwrap().priority, 3);
    assert_eq!(job.hints.as_ref().unwrap().expected_iterations, 50);
    assert_eq!(job.policy, "fair");
    let stats = s
        .admin
        .get_stats(GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.iterations_total, 3);

    // The timeline has the three main iterations, named, on lane 0, one after another.
    let timeline = s
        .admin
        .get_timeline(GetTimelineRequest { seconds: 0.0 })
        .await
        .unwrap()
        .into_inner();
    let mains: Vec<_> = timeline
        .spans
        .iter()
        .filter(|t| t.job == job.id && !t.cheap)
        .collect();
    assert_eq!(mains.len(), 3, "{timeline:?}");
    for (i, t) in mains.iter().enumerate() {
        assert_eq!(
            (t.job_name.as_str(), t.kind.as_str(), t.lane),
            ("trainer", "graph", Some(0))
        );
        assert!(
            0.0 <= t.end_seconds_ago && t.end_seconds_ago <= t.start_seconds_ago,
            "{t:?}"
        );
        assert!(t.start_seconds_ago <= timeline.now_uptime_seconds, "{t:?}");
        if i > 0 {
            assert!(
                mains[i - 1].end_seconds_ago >= t.start_seconds_ago,
                "{mains:?}"
            );
        }
    }
    assert_eq!(timeline.recorded_total, timeline.spans.len() as u64);
    let bad_window = s
        .admin
        .get_timeline(GetTimelineRequest { seconds: -1.0 })
        .await
        .unwrap_err();
    assert_eq!(bad_window.code(), Code::InvalidArgument);

    // Policy and hints change at run time; unknown names are clear errors.
    let changed = s
        .admin
        .set_policy(SetPolicyRequest {
            policy: "srtf".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (changed.previous.as_str(), changed.policy.as_str()),
        ("fair", "srtf")
    );
    let err = s
        .admin
        .set_policy(SetPolicyRequest {
            policy: "sjf".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("unknown scheduling policy"),
        "{}",
        err.message()
    );
    let updated = s
        .admin
        .set_job_hints(SetJobHintsRequest {
            job: "trainer".into(),
            hints: Some(JobHintsUpdate {
                priority: Some(9),
                expected_iterations: None,
                expected_seconds: Some(12.5),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.hints.unwrap().expected_seconds, 12.5);
    assert_eq!(updated.policy, "srtf");
    let missing = s
        .admin
        .set_job_hints(SetJobHintsRequest {
            job: "nobody".into(),
            hints: None,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);

    // Bad hints in the metadata are refused at CreateSession.
    let bad = ConfigProtoView {
        experimental: Some(config_proto_view::Experimental {
            session_metadata: Some(SessionMetadata {
                name: "x?prio=1".into(),
                version: 0,
            }),
        }),
        ..Default::default()
    };
    let err = s
        .master
        .create_session(CreateSessionRequest {
            config: bad.encode_to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("unknown job hint \"prio\""),
        "{}",
        err.message()
    );

    s.close(&handle).await;
    assert!(s.jobs().await.is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traced_runs_return_step_stats_with_the_runs_memory_peak() {
    let mut s = start().await;
    let axes = TensorProto {
        dtype: DataType::DtInt32 as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: 2,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        int_val: vec![0, 1],
        ..Default::default()
    };
    let g = graph(vec![
        node(
            "x",
            "Placeholder",
            &[],
            vec![("dtype", attr_type(DataType::DtFloat))],
        ),
        node(
            "sq",
            "Square",
            &["x"],
            vec![("T", attr_type(DataType::DtFloat))],
        ),
        node(
            "axes",
            "Const",
            &[],
            vec![
                ("dtype", attr_type(DataType::DtInt32)),
                (
                    "value",
                    AttrValue {
                        value: Some(attr_value::Value::Tensor(axes)),
                    },
                ),
            ],
        ),
        node(
            "total",
            "Sum",
            &["sq", "axes"],
            vec![
                ("T", attr_type(DataType::DtFloat)),
                ("Tidx", attr_type(DataType::DtInt32)),
            ],
        ),
    ]);
    let handle = s
        .master
        .create_session(CreateSessionRequest {
            graph_def: g,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_handle;
    let mut input = float_vector(&vec![1.5; 256 * 784]);
    input.tensor_shape = Some(TensorShapeProto {
        dim: [256, 784]
            .iter()
            .map(|&size| tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    });
    let response = s
        .master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(input),
            }],
            fetch: vec!["total:0".into()],
            // RunOptions { trace_level: FULL_TRACE }
            options: vec![0x08, 0x03].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        floats(response.tensor[0].tensor.as_ref().unwrap()),
        [2.25 * 256.0 * 784.0]
    );
    let memory = salus_server::runtime::memory_profile::step_memory(&response.metadata).unwrap();
    // The Square output (256 x 784 floats) is the run's largest live tensor.
    let squared = 256 * 784 * 4;
    assert!(
        memory.peak() >= squared && memory.peak() <= squared * 12 / 10,
        "{memory:?}"
    );
    s.close(&handle).await;
    s.shutdown().await;
}

/// A session whose graph has a main-iteration marker, with hints in its name.
async fn hinted_job(s: &mut TestServer, name: &str) -> String {
    let config = ConfigProtoView {
        experimental: Some(config_proto_view::Experimental {
            session_metadata: Some(SessionMetadata {
                name: name.into(),
                version: 0,
            }),
        }),
        ..Default::default()
    };
    let mut nodes = GraphDef::decode(base_graph()).unwrap().node;
    nodes.push(node(
        "salus_main_iter",
        "Identity",
        &["y"],
        vec![("T", attr_type(DataType::DtFloat))],
    ));
    s.master
        .create_session(CreateSessionRequest {
            graph_def: graph(nodes),
            config: config.encode_to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_handle
}

fn main_step(handle: &str) -> RunStepRequest {
    RunStepRequest {
        session_handle: handle.into(),
        feed: vec![NamedTensorProto {
            name: "x:0".into(),
            tensor: Some(float_vector(&[1.0])),
        }],
        fetch: vec!["salus_main_iter:0".into()],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_lanes_admit_wait_and_refuse() {
    let config = Config {
        memory_capacity: Some(100 << 20),
        admission_timeout: std::time::Duration::from_secs(20),
        ..Default::default()
    };
    let mut s = start_with(config).await;
    let a = hinted_job(&mut s, "a?persistent=40MiB&ephemeral=20MiB").await;
    let b = hinted_job(&mut s, "b?persistent=30MiB&ephemeral=10MiB").await;
    let c = hinted_job(&mut s, "c?persistent=30MiB&ephemeral=30MiB").await;
    let d = hinted_job(&mut s, "d?persistent=90MiB&ephemeral=20MiB").await;
    s.master.run_step(main_step(&a)).await.unwrap();
    s.master.run_step(main_step(&b)).await.unwrap();
    // c needs 60 MiB, 0 are free and no lane holds it: it waits.
    let mut master = s.master.clone();
    let c_handle = c.clone();
    let waiting = tokio::spawn(async move { master.run_step(main_step(&c_handle)).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    let jobs = s.jobs().await;
    let job_c = jobs.iter().find(|j| j.handle == c).unwrap();
    assert_eq!(job_c.state, "waiting for memory", "{job_c:?}");
    assert!(
        job_c.note.contains("needs 62914560 bytes"),
        "{}",
        job_c.note
    );
    assert_eq!(
        (
            job_c.persistent_source.as_str(),
            job_c.ephemeral_source.as_str()
        ),
        ("hint", "hint")
    );
    let info = s.server_info().await;
    assert_eq!(
        (info.memory_capacity_bytes, info.memory_free_bytes),
        (100 << 20, 0)
    );
    assert_eq!(info.memory_lanes.len(), 2);
    // Larger than the device: refused at once.
    let err = s.master.run_step(main_step(&d)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("device has 104857600 bytes"),
        "{}",
        err.message()
    );
    // a leaves: its lane returns to the pool and c runs.
    s.close(&a).await;
    waiting.await.unwrap().unwrap();
    let jobs = s.jobs().await;
    assert_eq!(
        jobs.iter().find(|j| j.handle == c).unwrap().memory_state,
        "admitted"
    );
    for handle in [b, c, d] {
        s.close(&handle).await;
    }
    let info = s.server_info().await;
    assert_eq!(info.memory_free_bytes, 100 << 20);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_lanes_are_fixed_and_pin_each_job_to_its_device() {
    // On a CPU-only TensorFlow the virtual GPUs do not exist: soft placement
    // runs the lane-placed graphs on the CPU, and the lanes stay budgets.
    let config = Config {
        memory_capacity: Some(100 << 20),
        gpu_lanes: 2,
        admission_timeout: std::time::Duration::from_secs(20),
        ..Default::default()
    };
    let mut s = start_with(config).await;
    let lanes = |info: &salus_proto::salus::v1::ServerInfo| -> Vec<(u64, usize)> {
        info.memory_lanes
            .iter()
            .map(|l| (l.size_bytes, l.jobs.len()))
            .collect()
    };
    let info = s.server_info().await;
    assert_eq!(lanes(&info), [(50 << 20, 0), (50 << 20, 0)]);
    // Each new job is bound to the roomiest lane when its session is created.
    let a = hinted_job(&mut s, "a?persistent=20MiB&ephemeral=10MiB").await;
    s.master.run_step(main_step(&a)).await.unwrap();
    let b = hinted_job(&mut s, "b?persistent=30MiB&ephemeral=10MiB").await;
    s.master.run_step(main_step(&b)).await.unwrap();
    // Lane 0 has 20 MiB of room, lane 1 10 MiB: c goes to lane 0 and shares it
    // (20 + 15 + max(10, 10) = 45 <= 50).
    let c = hinted_job(&mut s, "c?persistent=15MiB&ephemeral=10MiB").await;
    let out = s.master.run_step(main_step(&c)).await.unwrap().into_inner();
    assert_eq!(floats(out.tensor[0].tensor.as_ref().unwrap()), [2.0]);
    let info = s.server_info().await;
    assert_eq!(lanes(&info), [(50 << 20, 2), (50 << 20, 1)]);
    // Larger than a lane, though not than the device: refused at once.
    let d = hinted_job(&mut s, "d?persistent=45MiB&ephemeral=10MiB").await;
    let err = s.master.run_step(main_step(&d)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("its lane holds 52428800 bytes"),
        "{}",
        err.message()
    );
    for handle in [a, b, c, d] {
        s.close(&handle).await;
    }
    // Fixed lanes outlive their jobs: they are the devices' memory limits.
    let info = s.server_info().await;
    assert_eq!(lanes(&info), [(50 << 20, 0), (50 << 20, 0)]);
    assert_eq!(info.memory_free_bytes, 100 << 20);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_admission_follows_the_policy_rank() {
    let config = Config {
        memory_capacity: Some(100 << 20),
        policy: "srtf".into(),
        admission_timeout: std::time::Duration::from_secs(20),
        ..Default::default()
    };
    let mut s = start_with(config).await;
    let a = hinted_job(&mut s, "a?persistent=60MiB&ephemeral=20MiB").await;
    s.master.run_step(main_step(&a)).await.unwrap();
    // Both wait for a's memory; the short one asked last.
    let long = hinted_job(&mut s, "long?persistent=60MiB&ephemeral=20MiB&seconds=100").await;
    let short = hinted_job(&mut s, "short?persistent=60MiB&ephemeral=20MiB&seconds=1").await;
    let mut waiting = Vec::new();
    for handle in [&long, &short] {
        let mut master = s.master.clone();
        let handle = handle.clone();
        waiting.push(tokio::spawn(async move {
            master.run_step(main_step(&handle)).await
        }));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    s.close(&a).await;
    let short_run = waiting.pop().unwrap();
    short_run.await.unwrap().unwrap();
    let state = |jobs: &[salus_proto::salus::v1::JobInfo], handle: &str| {
        jobs.iter()
            .find(|j| j.handle == handle)
            .unwrap()
            .memory_state
            .clone()
    };
    let jobs = s.jobs().await;
    assert_eq!(state(&jobs, &short), "admitted");
    assert_eq!(state(&jobs, &long), "waiting for memory");
    s.close(&short).await;
    waiting.pop().unwrap().await.unwrap().unwrap();
    s.close(&long).await;
    s.shutdown().await;
}
