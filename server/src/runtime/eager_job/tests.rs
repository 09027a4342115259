//! The context thread with a real TFE context in this process and no network:
//! the handle table, early sends, held stream failures and decref ordering.

use super::*;
use crate::runtime::executor::Executor;
use crate::sched::{policy, SchedConfig};
use salus_proto::tensorflow::TensorShapeProto;

fn spec(id: u64, context_id: u64) -> EagerJobSpec {
    let executor = Executor::new(policy::by_name("fair").unwrap(), SchedConfig::default());
    EagerJobSpec {
        id: JobId(id),
        context_id,
        hints: Hints::default(),
        config: Vec::new(),
        devices: DeviceNames::new("worker", 0, 0, vec!["localhost".into()]),
        keep_alive: None,
        context_view_id: 0,
        max_tensor_bytes: 1 << 20,
        tenant: Arc::new(TenantRules::default()),
        checkpoint_dir: std::env::temp_dir().join(format!(
            "salus-eager-tests-{}-{context_id}",
            std::process::id()
        )),
        scheduling: Scheduling {
            iterations: Iterations {
                port: crate::runtime::sched_port::SchedPort::Local(executor),
                admission: None,
                draining: Arc::new(AtomicBool::new(false)),
            },
            runtime: tokio::runtime::Handle::current(),
            cheap_below: Duration::ZERO,
            measure_memory: false,
            gpu_lane: None,
        },
    }
}

async fn job(context_id: u64) -> EagerJob {
    let spec = spec(context_id, context_id);
    tokio::task::spawn_blocking(move || EagerJob::create(spec))
        .await
        .unwrap()
        .expect("a TFE context")
}

fn floats(values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(shape_proto(vec![values.len() as i64])),
        float_val: values.to_vec(),
        ..Default::default()
    }
}

fn push(op_id: i64, values: &[f32]) -> Item {
    Item::SendTensors {
        op_id,
        tensors: vec![floats(values)],
        device: String::new(),
    }
}

fn identity(id: i64, of: i64) -> Item {
    Item::Execute(OpRequest {
        id,
        name: "Identity".into(),
        inputs: vec![OpInput::Handle {
            op_id: of,
            output: 0,
        }],
        attrs: Vec::new(),
        device: String::new(),
        is_function: false,
    })
}

fn send(id: i64, of: i64, name: &str) -> Item {
    let tensor_name = AttrValue {
        value: Some(attr_value::Value::S(Bytes::from(name.to_string()))),
    };
    Item::Execute(OpRequest {
        id,
        name: "_Send".into(),
        inputs: vec![OpInput::Handle {
            op_id: of,
            output: 0,
        }],
        attrs: vec![("tensor_name".into(), tensor_name.encode_to_vec().into())],
        device: String::new(),
        is_function: false,
    })
}

fn decref(op_id: i64) -> Item {
    Item::Decref { op_id, output: 0 }
}

/// A checkpoint write (an op without outputs) whose path is outside the
/// job's checkpoint directory: it fails before it runs.
fn escaping_save(id: i64) -> Item {
    let path = TensorProto {
        dtype: DataType::DtString as i32,
        tensor_shape: Some(TensorShapeProto::default()),
        string_val: vec![Bytes::from_static(b"/salus-escape/ckpt")],
        ..Default::default()
    };
    Item::Execute(OpRequest {
        id,
        name: "SaveV2".into(),
        inputs: vec![OpInput::Tensor(path)],
        attrs: Vec::new(),
        device: String::new(),
        is_function: false,
    })
}

async fn run_on(
    job: &EagerJob,
    items: Vec<Item>,
    stream: Option<Arc<StreamState>>,
) -> Result<Vec<ItemOutput>> {
    let admitted = job.admit().await?;
    let rx = job.submit(items, stream, admitted)?;
    rx.await.expect("answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_are_found_by_op_and_output_and_unknown_ones_are_named() {
    let job = job(101).await;
    let out = job
        .run(vec![push(1, &[1.0, 2.0]), identity(2, 1)])
        .await
        .unwrap();
    assert_eq!(out[1].shapes, vec![vec![2]]);
    assert_eq!(job.stats().handles.load(Ordering::Relaxed), 2);

    // An id no op produced, and an output the op does not have.
    for missing in [identity(3, 99), {
        let mut op = identity(3, 1);
        if let Item::Execute(op) = &mut op {
            op.inputs = vec![OpInput::Handle {
                op_id: 1,
                output: 4,
            }];
        }
        op
    }] {
        let err = job.run(vec![missing]).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("unknown tensor handle"), "{err}");
        assert!(err.to_string().contains("eager context 101"), "{err}");
    }

    // Every op needs a new id.
    let err = job.run(vec![push(2, &[3.0])]).await.unwrap_err();
    assert!(err.to_string().contains("already in use"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_contexts_handles_are_unknown_here() {
    let (a, b) = (job(201).await, job(202).await);
    a.run(vec![push(1, &[1.0])]).await.unwrap();
    let err = b.run(vec![identity(2, 1)]).await.unwrap_err();
    assert!(
        err.to_string().contains("unknown tensor handle 1:0"),
        "{err}"
    );
    assert!(err.to_string().contains("eager context 202"), "{err}");
    // a's handle is still there.
    a.run(vec![identity(2, 1)]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decref_queued_behind_an_op_frees_the_handle_only_after_it() {
    let job = job(301).await;
    // In one request, in order: the op before the decref sees the handle,
    // the op after it does not.
    let err = job
        .run(vec![
            push(1, &[1.0]),
            identity(2, 1),
            decref(1),
            identity(3, 1),
        ])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown tensor handle 1:0"),
        "{err}"
    );
    job.run(vec![identity(4, 2)]).await.expect("op 2 ran");
    // Decref is lenient, like a destructor: twice, or of a handle never made.
    job.run(vec![decref(1), decref(77)]).await.unwrap();
    assert_eq!(job.stats().handles.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_goes_early_only_when_its_value_exists_and_no_decref_is_queued() {
    let job = job(401).await;
    job.run(vec![push(1, &[5.0]), push(2, &[6.0])])
        .await
        .unwrap();
    let shared = &job.shared;

    // Exists: it goes early, and its item is answered in its place.
    let mut items = vec![send(10, 1, "a")];
    let ready = take_ready_sends(shared, &mut items);
    assert_eq!(ready.len(), 1);
    assert!(matches!(&items[0], Item::SentEarly(name) if name == "a"));

    // Released earlier in the same request, not yet produced, or released by
    // a request still queued (its decref pending): it waits for its turn.
    let mut items = vec![decref(1), send(11, 1, "b"), send(12, 9, "c")];
    assert!(take_ready_sends(shared, &mut items).is_empty());
    shared.note_pending_decrefs(&[(2, 0)], true);
    let mut items = vec![send(13, 2, "d")];
    assert!(take_ready_sends(shared, &mut items).is_empty());
    assert!(matches!(&items[0], Item::Execute(_)));
    // Once that decref was applied or given up, the value may go early again.
    shared.note_pending_decrefs(&[(2, 0)], false);
    assert_eq!(take_ready_sends(shared, &mut items).len(), 1);

    // What goes early reaches its pull.
    shared.rendezvous.announce("a");
    send_ready_values(Arc::clone(shared), ready, None, None);
    let sent = job.recv("a", Duration::from_secs(5)).await.unwrap();
    assert_eq!(sent.tensor.dtype, DataType::DtFloat as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_send_of_a_held_failure_reports_it_to_its_pull() {
    let job = job(451).await;
    job.run(vec![push(1, &[5.0])]).await.unwrap();
    let mut items = vec![send(10, 1, "v")];
    let ready = take_ready_sends(&job.shared, &mut items);
    job.shared.rendezvous.announce("v");
    let held = TfError::new(TfCode::InvalidArgument as i32, "an earlier op failed");
    send_ready_values(Arc::clone(&job.shared), ready, Some(held), None);
    let err = job.recv("v", Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("an earlier op failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_a_silent_failure_for_its_next_sync() {
    let job = job(501).await;
    let stream = Arc::new(StreamState::new());
    job.stream_opened(&stream);
    // The failed op has no outputs and ends its request: the client would
    // not wait for it, so the request is answered as done...
    let out = run_on(&job, vec![escaping_save(1)], Some(stream.clone()))
        .await
        .expect("answered as done");
    assert_eq!(out.len(), 1);
    assert!(!stream.failed.load(Ordering::SeqCst));
    // ... an op with outputs is not where it is reported ...
    run_on(&job, vec![push(2, &[1.0])], Some(stream.clone()))
        .await
        .unwrap();
    // ... and the next sync reports it, naming the op that failed.
    let err = run_on(&job, vec![Item::Sync], Some(stream.clone()))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("op SaveV2"), "{text}");
    assert!(
        text.contains("outside this job's checkpoint directory"),
        "{text}"
    );
    assert!(text.contains("reported by this later call"), "{text}");
    // Once: the stream ended with it, so later requests are not run.
    assert!(stream.failed.load(Ordering::SeqCst));
    let err = run_on(&job, vec![Item::Sync], Some(stream.clone()))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("an earlier request on this stream failed"),
        "{err}"
    );

    // Without a stream (a unary Enqueue) the same failure is answered at once.
    let err = job.run(vec![escaping_save(3)]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_failure_goes_to_the_pull_of_the_next_value_read() {
    let job = job(601).await;
    job.run(vec![push(1, &[1.0])]).await.unwrap();
    let stream = Arc::new(StreamState::new());
    run_on(&job, vec![escaping_save(2)], Some(stream.clone()))
        .await
        .unwrap();
    // A value read: its pull gets the failure, the stream goes on.
    run_on(&job, vec![send(3, 1, "x")], Some(stream.clone()))
        .await
        .expect("the read's request is answered");
    let err = job.recv("x", Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("op SaveV2"), "{err}");
    assert!(!stream.failed.load(Ordering::SeqCst));
    run_on(&job, vec![Item::Sync], Some(stream)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_context_refuses_requests_with_the_reason() {
    let job = job(701).await;
    job.run(vec![push(1, &[1.0])]).await.unwrap();
    let closing = Arc::new(job);
    let closer = closing.clone();
    tokio::task::spawn_blocking(move || closer.close("the test closed it"))
        .await
        .unwrap();
    let err = closing.run(vec![identity(2, 1)]).await.unwrap_err();
    assert!(matches!(err, Error::ContextGone(_)), "{err}");
    assert!(err.to_string().contains("the test closed it"), "{err}");
}
