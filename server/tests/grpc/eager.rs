//! Starts the real server on port 0 and drives its remote-eager front end with
//! raw requests shaped like the stock TF2 client's: a context, pushed tensors,
//! ops, a registered function, `_Send` + RecvTensor, streams; then hostile
//! requests, each of which must get a clear error and leave the server healthy.

use crate::common::{float_vector, floats};

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use salus_proto::salus::v1::admin_client::AdminClient;
use salus_proto::salus::v1::ListJobsRequest;
use salus_proto::tensorflow::eager::eager_service_client::EagerServiceClient;
use salus_proto::tensorflow::eager::*;
use salus_proto::tensorflow::worker_service_client::WorkerServiceClient;
use salus_proto::tensorflow::{
    attr_value, tensor_shape_proto, AttrValue, DataType, GetStatusRequest, NameAttrList,
    RecvTensorRequest, TensorProto, TensorShapeProto,
};
use salus_server::config::Config;
use tonic::transport::Channel;
use tonic::Code;

const DEVICE: &str = "/job:worker/replica:0/task:0/device:CPU:0";

/// FunctionDef and the OpDef parts it needs (TensorFlow's field numbers); the
/// server's own protos keep FunctionDef as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct FunctionDef {
    #[prost(message, optional, tag = "1")]
    signature: Option<OpDef>,
    #[prost(message, repeated, tag = "3")]
    node_def: Vec<salus_proto::tensorflow::NodeDef>,
    #[prost(map = "string, string", tag = "4")]
    ret: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OpDef {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "2")]
    input_arg: Vec<ArgDef>,
    #[prost(message, repeated, tag = "3")]
    output_arg: Vec<ArgDef>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ArgDef {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(enumeration = "DataType", tag = "3")]
    r#type: i32,
}

fn attr(value: attr_value::Value) -> Bytes {
    AttrValue { value: Some(value) }.encode_to_vec().into()
}

fn handle(op_id: i64) -> operation::Input {
    operation::Input {
        item: Some(operation::input::Item::RemoteHandle(RemoteTensorHandle {
            op_id,
            device: DEVICE.into(),
            op_device: DEVICE.into(),
            dtype: DataType::DtFloat as i32,
            ..Default::default()
        })),
    }
}

fn op(id: i64, name: &str, inputs: Vec<operation::Input>, attrs: Vec<(&str, Bytes)>) -> QueueItem {
    QueueItem {
        item: Some(queue_item::Item::Operation(Operation {
            id,
            name: name.into(),
            op_inputs: inputs,
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            device: DEVICE.into(),
            ..Default::default()
        })),
    }
}

fn float_op(id: i64, name: &str, inputs: Vec<operation::Input>) -> QueueItem {
    op(
        id,
        name,
        inputs,
        vec![("T", attr(attr_value::Value::Type(DataType::DtFloat as i32)))],
    )
}

fn send_tensor(op_id: i64, tensor: TensorProto) -> QueueItem {
    QueueItem {
        item: Some(queue_item::Item::SendTensor(SendTensorOp {
            op_id,
            tensors: vec![tensor],
            device_name: DEVICE.into(),
        })),
    }
}

/// A `_Send` of `input` to the client under `tensor_name`, as the client enqueues it.
fn send_op(id: i64, input: i64, tensor_name: &str) -> QueueItem {
    op(
        id,
        "_Send",
        vec![handle(input)],
        vec![
            ("T", attr(attr_value::Value::Type(DataType::DtFloat as i32))),
            (
                "tensor_name",
                attr(attr_value::Value::S(tensor_name.as_bytes().to_vec().into())),
            ),
            (
                "send_device",
                attr(attr_value::Value::S(DEVICE.as_bytes().to_vec().into())),
            ),
            (
                "recv_device",
                attr(attr_value::Value::S(
                    b"/job:localhost/replica:0/task:0/device:CPU:0"
                        .to_vec()
                        .into(),
                )),
            ),
            ("send_device_incarnation", attr(attr_value::Value::I(1))),
            ("client_terminated", attr(attr_value::Value::B(false))),
        ],
    )
}

fn rendezvous_key(tensor_name: &str) -> String {
    format!(
        "{DEVICE};0000000000000001;/job:localhost/replica:0/task:0/device:CPU:0;{tensor_name};0:0"
    )
}

/// square(x) = x * x, as a FunctionDef.
fn square_function(name: &str, op: &str) -> Bytes {
    FunctionDef {
        signature: Some(OpDef {
            name: name.into(),
            input_arg: vec![ArgDef {
                name: "x".into(),
                r#type: DataType::DtFloat as i32,
            }],
            output_arg: vec![ArgDef {
                name: "y".into(),
                r#type: DataType::DtFloat as i32,
            }],
        }),
        node_def: vec![salus_proto::tensorflow::NodeDef {
            name: "mul".into(),
            op: op.into(),
            input: vec!["x".into(), "x".into()],
            // The client's name for the server: mapped to the server's context.
            device: DEVICE.into(),
            attr: [(
                "T".to_string(),
                AttrValue {
                    value: Some(attr_value::Value::Type(DataType::DtFloat as i32)),
                },
            )]
            .into_iter()
            .collect(),
        }],
        ret: [("y".to_string(), "mul:z:0".to_string())]
            .into_iter()
            .collect(),
    }
    .encode_to_vec()
    .into()
}

fn register(function_def: Bytes) -> QueueItem {
    QueueItem {
        item: Some(queue_item::Item::RegisterFunction(RegisterFunctionOp {
            function_def,
            ..Default::default()
        })),
    }
}

/// The stream's next response, which must be a success (`what` says why).
async fn answered(
    responses: &mut tonic::Streaming<EnqueueResponse>,
    what: &str,
) -> EnqueueResponse {
    responses.message().await.expect(what).expect("a response")
}

struct TestServer {
    eager: EagerServiceClient<Channel>,
    worker: WorkerServiceClient<Channel>,
    admin: AdminClient<Channel>,
    server: crate::common::Running,
}

impl TestServer {
    /// Sends `requests` on one StreamingEnqueue stream; its responses, in order.
    async fn stream(&mut self, requests: Vec<EnqueueRequest>) -> tonic::Streaming<EnqueueResponse> {
        self.eager
            .streaming_enqueue(tokio_stream::iter(requests))
            .await
            .unwrap()
            .into_inner()
    }

    async fn start() -> TestServer {
        TestServer::start_with(Config::default()).await
    }

    async fn start_with(config: Config) -> TestServer {
        let server = crate::common::Running::start(config).await;
        TestServer {
            eager: EagerServiceClient::new(server.channel.clone()),
            worker: WorkerServiceClient::new(server.channel.clone()),
            admin: AdminClient::new(server.channel.clone()),
            server,
        }
    }

    async fn create_context(&mut self, context_id: u64, name: &str) {
        // ConfigProto.experimental (16) . session_metadata (11) . name (1)
        let mut metadata = vec![0x0a, name.len() as u8];
        metadata.extend_from_slice(name.as_bytes());
        let mut experimental = vec![0x5a, metadata.len() as u8];
        experimental.extend_from_slice(&metadata);
        let mut config = vec![0x82, 0x01, experimental.len() as u8];
        config.extend_from_slice(&experimental);
        let response = self
            .eager
            .create_context(CreateContextRequest {
                server_def: Some(ServerDef {
                    cluster: Some(ClusterDef {
                        job: vec![
                            JobDef {
                                name: "worker".into(),
                                tasks: [(0, "127.0.0.1:1".to_string())].into_iter().collect(),
                            },
                            JobDef {
                                name: "localhost".into(),
                                tasks: [(0, "localhost:2".to_string())].into_iter().collect(),
                            },
                        ],
                    }),
                    job_name: "worker".into(),
                    default_session_config: config.into(),
                    protocol: "grpc".into(),
                    ..Default::default()
                }),
                keep_alive_secs: 600,
                context_id,
                lazy_copy_remote_function_inputs: true,
                ..Default::default()
            })
            .await
            .expect("context created")
            .into_inner();
        assert!(
            response.device_attributes.iter().any(|d| d.name == DEVICE),
            "{response:?}"
        );
    }

    async fn enqueue(
        &mut self,
        context_id: u64,
        queue: Vec<QueueItem>,
    ) -> Result<EnqueueResponse, tonic::Status> {
        self.eager
            .enqueue(EnqueueRequest { context_id, queue })
            .await
            .map(|r| r.into_inner())
    }

    async fn recv(
        &mut self,
        context_id: u64,
        tensor_name: &str,
    ) -> Result<TensorProto, tonic::Status> {
        self.worker
            .recv_tensor(RecvTensorRequest {
                step_id: context_id as i64,
                rendezvous_key: rendezvous_key(tensor_name),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().tensor.unwrap_or_default())
    }

    /// Squares [1, 2] on the server and pulls the result: the context works.
    async fn assert_healthy(&mut self, context_id: u64, first_id: i64) {
        let out = self
            .enqueue(
                context_id,
                vec![
                    send_tensor(first_id, float_vector(&[1.0, 2.0])),
                    float_op(
                        first_id + 1,
                        "Mul",
                        vec![handle(first_id), handle(first_id)],
                    ),
                    send_op(first_id + 2, first_id + 1, &format!("healthy_{first_id}")),
                ],
            )
            .await
            .expect("a good request still runs");
        assert_eq!(out.queue_response[1].shape[0].dim[0].size, 2);
        let tensor = self
            .recv(context_id, &format!("healthy_{first_id}"))
            .await
            .unwrap();
        assert_eq!(floats(&tensor), vec![1.0, 4.0]);
    }

    async fn shutdown(self) {
        drop(self.eager);
        drop(self.worker);
        drop(self.admin);
        self.server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_ops_functions_sends_and_streams_run_on_the_server() {
    let mut s = TestServer::start().await;
    let status = s
        .worker
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(status
        .device_attributes
        .iter()
        .any(|d| d.device_type == "CPU"));

    s.create_context(11, "eager-test?priority=3").await;
    // Ops on pushed tensors, the result pulled by RecvTensor; the pull is sent
    // first, as the stock client may do.
    let mut worker = s.worker.clone();
    let early_pull = tokio::spawn(async move {
        worker
            .recv_tensor(RecvTensorRequest {
                step_id: 11,
                rendezvous_key: rendezvous_key("ctx11_4"),
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let out = s
        .enqueue(
            11,
            vec![
                send_tensor(1, float_vector(&[1.0, 2.0, 3.0])),
                send_tensor(2, float_vector(&[2.0])),
                float_op(3, "Mul", vec![handle(1), handle(2)]),
                send_op(4, 3, "ctx11_4"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(out.queue_response.len(), 4);
    assert_eq!(out.queue_response[2].shape[0].dim[0].size, 3);
    let pulled = early_pull
        .await
        .unwrap()
        .unwrap()
        .into_inner()
        .tensor
        .unwrap();
    assert_eq!(floats(&pulled), vec![2.0, 4.0, 6.0]);

    // A registered function, called like the client calls tf.functions.
    let mut call = op(6, "__inference_square_1", vec![handle(3)], vec![]);
    if let Some(queue_item::Item::Operation(o)) = &mut call.item {
        o.is_function = true;
    }
    let out = s
        .enqueue(
            11,
            vec![
                register(square_function("__inference_square_1", "Mul")),
                call,
                send_op(7, 6, "sq"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(out.queue_response[1].device, vec![DEVICE.to_string()]);
    assert_eq!(
        floats(&s.recv(11, "sq").await.unwrap()),
        vec![4.0, 16.0, 36.0]
    );

    // A stream: requests pipelined, answered in order.
    let requests: Vec<EnqueueRequest> = (0..3)
        .map(|i| EnqueueRequest {
            context_id: 11,
            queue: vec![float_op(
                100 + i,
                "AddV2",
                vec![handle(3), handle(if i == 0 { 3 } else { 100 + i - 1 })],
            )],
        })
        .collect();
    let mut responses = s.stream(requests).await;
    let mut count = 0;
    while let Some(response) = responses.message().await.unwrap() {
        assert_eq!(response.queue_response[0].shape[0].dim[0].size, 3);
        count += 1;
    }
    assert_eq!(count, 3);
    s.enqueue(11, vec![send_op(200, 102, "sum")]).await.unwrap();
    assert_eq!(
        floats(&s.recv(11, "sum").await.unwrap()),
        vec![8.0, 16.0, 24.0]
    );

    // Released handles are gone.
    s.enqueue(
        11,
        vec![QueueItem {
            item: Some(queue_item::Item::HandleToDecref(RemoteTensorHandle {
                op_id: 102,
                ..Default::default()
            })),
        }],
    )
    .await
    .unwrap();
    let err = s
        .enqueue(11, vec![send_op(201, 102, "gone")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Listed beside graph jobs, with its kind and hints.
    let jobs = s
        .admin
        .list_jobs(ListJobsRequest {})
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let job = jobs
        .iter()
        .find(|j| j.kind == "eager")
        .expect("the eager job is listed");
    assert_eq!(job.name, "eager-test");
    assert_eq!(job.hints.as_ref().unwrap().priority, 3);
    assert_eq!(job.graph_nodes, 1, "one registered function");

    // Closed: later requests name an unknown context.
    s.eager
        .close_context(CloseContextRequest {
            context_id: 11,
            context_view_id: 0,
        })
        .await
        .unwrap();
    let err = s
        .enqueue(11, vec![send_tensor(300, float_vector(&[1.0]))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains("not found"), "{err:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_eager_requests_get_clear_errors_and_leave_the_server_healthy() {
    let mut s = TestServer::start().await;
    s.create_context(21, "hostile").await;

    // A pull for a key nobody sends: fails after the grace period (runs meanwhile).
    let mut worker = s.worker.clone();
    let never = tokio::spawn(async move {
        worker
            .recv_tensor(RecvTensorRequest {
                step_id: 21,
                rendezvous_key: rendezvous_key("never_sent"),
                ..Default::default()
            })
            .await
    });

    // Unknown context.
    let err = s
        .enqueue(999, vec![send_tensor(1, float_vector(&[1.0]))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains("999"), "{err:?}");
    // A context id that is taken.
    let err = s
        .eager
        .create_context(CreateContextRequest {
            server_def: Some(ServerDef {
                job_name: "worker".into(),
                ..Default::default()
            }),
            context_id: 21,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Unknown handle.
    let err = s
        .enqueue(21, vec![float_op(2, "Neg", vec![handle(12345)])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("12345"), "{err:?}");
    // Malformed FunctionDef, and one TensorFlow itself refuses.
    let err = s
        .enqueue(21, vec![register(Bytes::from_static(b"\x0a\xff\xff"))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // TensorFlow checks a function's ops when it is first called.
    s.enqueue(
        21,
        vec![register(square_function("__inference_bad_2", "NoSuchOp"))],
    )
    .await
    .unwrap();
    s.enqueue(21, vec![send_tensor(50, float_vector(&[1.0]))])
        .await
        .unwrap();
    let err = s
        .enqueue(
            21,
            vec![float_op(51, "__inference_bad_2", vec![handle(50)])],
        )
        .await
        .unwrap_err();
    assert!(err.message().contains("NoSuchOp"), "{err:?}");
    // Lying TensorProto: 3 floats claimed, 2 sent.
    let mut lying = float_vector(&[1.0, 2.0]);
    lying.tensor_shape.as_mut().unwrap().dim[0].size = 3;
    let err = s
        .enqueue(21, vec![send_tensor(3, lying)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // Wrong dtypes: a float and an int32 input to one AddV2.
    let int_tensor = TensorProto {
        dtype: DataType::DtInt32 as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: 1,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        int_val: vec![7],
        ..Default::default()
    };
    let err = s
        .enqueue(
            21,
            vec![
                send_tensor(4, float_vector(&[1.0])),
                send_tensor(40, int_tensor),
                float_op(5, "AddV2", vec![handle(4), handle(40)]),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("int32"), "{err:?}");
    // Duplicate op ids.
    s.enqueue(21, vec![send_tensor(6, float_vector(&[1.0]))])
        .await
        .unwrap();
    let err = s
        .enqueue(21, vec![send_tensor(6, float_vector(&[2.0]))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("already in use"), "{err:?}");
    // Ops that reach the server's files: eagerly and inside a function.
    let err = s
        .enqueue(21, vec![op(7, "ReadFile", vec![handle(6)], vec![])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("ReadFile"), "{err:?}");
    // A refused function is answered as registered (the stock client registers every function it
    // traces and only logs a failure); calling it, or naming it in an op's attribute, is refused.
    s.enqueue(
        21,
        vec![register(square_function("__inference_read_3", "ReadFile"))],
    )
    .await
    .unwrap();
    let mut call = op(30, "__inference_read_3", vec![handle(6)], vec![]);
    if let Some(queue_item::Item::Operation(o)) = &mut call.item {
        o.is_function = true;
    }
    let err = s.enqueue(21, vec![call]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("refused when registered") && err.message().contains("ReadFile"),
        "{err:?}"
    );
    let naming = op(
        31,
        "MapDataset",
        vec![handle(6)],
        vec![(
            "f",
            attr(attr_value::Value::Func(NameAttrList {
                name: "__inference_read_3".into(),
                ..Default::default()
            })),
        )],
    );
    let err = s.enqueue(21, vec![naming]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("attribute f"), "{err:?}");
    // A device on the client's own job.
    let mut on_client = float_op(8, "Neg", vec![handle(6)]);
    if let Some(queue_item::Item::Operation(o)) = &mut on_client.item {
        o.device = "/job:localhost/replica:0/task:0/device:CPU:0".into();
    }
    let err = s.enqueue(21, vec![on_client]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("client"), "{err:?}");
    // An empty queue item, a malformed rendezvous key, an unknown method's context.
    let err = s
        .enqueue(21, vec![QueueItem { item: None }])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = s
        .worker
        .recv_tensor(RecvTensorRequest {
            step_id: 21,
            rendezvous_key: "nonsense".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // A stream whose request fails ends with that error; a new stream works.
    let requests = vec![
        EnqueueRequest {
            context_id: 21,
            queue: vec![float_op(9, "Neg", vec![handle(777)])],
        },
        EnqueueRequest {
            context_id: 21,
            queue: vec![float_op(10, "Neg", vec![handle(6)])],
        },
    ];
    let mut responses = s.stream(requests).await;
    let err = responses.message().await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    let err = never.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("never_sent"), "{err:?}");

    s.assert_healthy(21, 1000).await;
    s.create_context(22, "after").await;
    s.assert_healthy(22, 1).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_hold_a_bounded_number_of_handles_and_functions() {
    let config = Config {
        tenant: salus_server::tenant::TenantRules {
            max_context_handles: 3,
            max_context_functions: 1,
            ..Default::default()
        },
        ..Config::default()
    };
    let mut s = TestServer::start_with(config).await;
    s.create_context(31, "bounded").await;
    s.enqueue(
        31,
        vec![
            send_tensor(1, float_vector(&[1.0])),
            send_tensor(2, float_vector(&[2.0])),
        ],
    )
    .await
    .unwrap();
    s.enqueue(31, vec![float_op(3, "Neg", vec![handle(1)])])
        .await
        .unwrap();
    let err = s
        .enqueue(31, vec![float_op(4, "Neg", vec![handle(2)])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("--max-context-handles"), "{err:?}");
    // Released handles make room again.
    let decref = |op_id| QueueItem {
        item: Some(queue_item::Item::HandleToDecref(RemoteTensorHandle {
            op_id,
            ..Default::default()
        })),
    };
    s.enqueue(31, vec![decref(1), decref(3)]).await.unwrap();
    s.enqueue(31, vec![float_op(5, "Neg", vec![handle(2)])])
        .await
        .unwrap();
    s.enqueue(
        31,
        vec![register(square_function("__inference_one_1", "Mul"))],
    )
    .await
    .unwrap();
    let err = s
        .enqueue(
            31,
            vec![register(square_function("__inference_two_2", "Mul"))],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("--max-context-functions"), "{err:?}");
    // The same function again is not a new one.
    s.enqueue(
        31,
        vec![register(square_function("__inference_one_1", "Mul"))],
    )
    .await
    .unwrap();
    s.shutdown().await;
}

/// The stock client keeps nothing that would raise the failure of an op without
/// outputs (a SaveV2, an AssignVariableOp) from its response, and learns of it
/// from its next sync: on a stream, such a request is answered as done and the
/// stream's next sync item or value read fails with its error, once (as does a
/// later item that fails on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_op_without_outputs_is_reported_by_the_streams_next_read_or_sync() {
    let mut s = TestServer::start().await;
    s.create_context(41, "silent").await;
    let request = |queue: Vec<QueueItem>| EnqueueRequest {
        context_id: 41,
        queue,
    };
    // A float tensor where a resource handle belongs: TensorFlow refuses the op.
    let assign = |id| {
        op(
            id,
            "AssignVariableOp",
            vec![handle(1), handle(1)],
            vec![(
                "dtype",
                attr(attr_value::Value::Type(DataType::DtFloat as i32)),
            )],
        )
    };
    let sync = QueueItem {
        item: Some(queue_item::Item::SyncRemoteExecutorForStream(
            Default::default(),
        )),
    };
    let unary = s
        .enqueue(41, vec![send_tensor(1, float_vector(&[1.0])), assign(2)])
        .await
        .unwrap_err();
    assert_eq!(
        unary.code(),
        Code::InvalidArgument,
        "a unary request gets its error at once: {unary:?}"
    );

    let requests = vec![
        request(vec![assign(3)]),
        request(vec![assign(4)]),
        request(vec![sync.clone()]),
    ];
    let mut responses = s.stream(requests).await;
    for _ in 0..2 {
        let done = answered(&mut responses, "answered as done").await;
        assert_eq!(done.queue_response.len(), 1);
    }
    let reported = responses.message().await.unwrap_err();
    assert_eq!(
        reported.code(),
        unary.code(),
        "the first failure: {reported:?}"
    );
    assert!(
        reported.message().starts_with("op AssignVariableOp: ")
            && reported.message().contains(unary.message())
            && reported.message().contains("reported by this later call"),
        "the first failure, naming its op: {reported:?}"
    );

    // An op with outputs runs: the client does not wait for one. The next value
    // it reads reports the failure, through the pull of the read's `_Send`
    // (whose request is answered: the stream goes on).
    let requests = vec![
        request(vec![assign(6)]),
        request(vec![float_op(7, "Neg", vec![handle(1)])]),
        request(vec![send_op(8, 7, "held_read")]),
    ];
    let mut responses = s.stream(requests).await;
    answered(&mut responses, "answered as done").await;
    answered(&mut responses, "an op with outputs runs").await;
    answered(&mut responses, "the read's send").await;
    drop(responses);
    let pulled = s.recv(41, "held_read").await.unwrap_err();
    assert_eq!(pulled.code(), unary.code(), "{pulled:?}");
    assert!(
        pulled.message().contains("AssignVariableOp")
            && pulled.message().contains("reported by this later call"),
        "{pulled:?}"
    );

    // A later item that fails on its own reports the held failure: it came first.
    let requests = vec![
        request(vec![assign(9)]),
        request(vec![float_op(10, "Neg", vec![handle(12345)])]),
    ];
    let mut responses = s.stream(requests).await;
    answered(&mut responses, "answered as done").await;
    let err = responses.message().await.unwrap_err();
    assert!(
        err.message().contains("AssignVariableOp") && !err.message().contains("12345"),
        "{err:?}"
    );

    // Reported once; an op with outputs fails its own request, ending the stream there.
    let requests = vec![
        request(vec![sync.clone()]),
        request(vec![float_op(5, "Neg", vec![handle(12345)])]),
    ];
    let mut responses = s.stream(requests).await;
    answered(&mut responses, "nothing held").await;
    let err = responses.message().await.unwrap_err();
    assert!(err.message().contains("12345"), "{err:?}");
    s.assert_healthy(41, 10).await;
    s.shutdown().await;
}
