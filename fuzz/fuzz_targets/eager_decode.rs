//! Fuzzes what the remote-eager front end does with a request body before an
//! eager context is involved.
//!
//! The first input byte picks the request type (modulo 8, in the order of
//! [`KINDS`]) and, divided by 8 (modulo 3), how the client names this server
//! ([`device_names`]); the rest is the message body, decoded with prost exactly
//! as the gRPC codec does. Then the context-free part of the handlers runs
//! (see `server/src/frontend/eager/` and `server/src/runtime/eager_job/`):
//! - Enqueue (also StreamingEnqueue's messages): `queue_items`, then for each
//!   item: `DeviceNames::to_local` of op and send_tensor devices,
//!   `TenantRules::check_eager_op`, every inline and sent tensor through
//!   `Tensor::from_proto` (1 MiB limit), the `_Send` tensor_name attribute, and
//!   for each FunctionDef of a register_function: the server's `map_function`
//!   (its `FunctionDefView`, `check_function`, and the node-device rewrite the
//!   server hands to TensorFlow); then
//!   `enqueue_response` of outputs shaped like the built tensors;
//! - CreateContext: the job name check, `session_config` on the ServerDef's
//!   ConfigProto bytes, `Hints::parse` of the session metadata name, and the
//!   `DeviceNames` the context would get, renaming the server's devices;
//! - RecvTensor: `tensor_name` of the rendezvous key;
//! - RunComponentFunction: the refusal the handler sends;
//! - KeepAlive, CloseContext, WaitQueueDone, UpdateContext: decoding only.
//!
//! Invariants besides "no panic": a mapped device of a named job is on
//! `/job:localhost/replica:0/task:0` and maps back to the client's name and
//! again to itself; a rewritten FunctionDef differs from the client's only in
//! node devices (same bytes once those are stripped, same signature, node ops in
//! order, and each device is its `node_to_local` mapping); the config TensorFlow
//! gets holds no client device fields and no session metadata; a tensor name
//! is the fourth of five `;`-separated parts; no built tensor exceeds the limit.
//! Every error goes through the one `Error` -> `tonic::Status` mapping and is
//! rendered as the HTTP response tonic would send.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use salus_proto::tensorflow::eager::{
    CloseContextRequest, CreateContextRequest, EnqueueRequest, KeepAliveRequest,
    RunComponentFunctionRequest, UpdateContextRequest, WaitQueueDoneRequest,
};
use salus_proto::tensorflow::{
    attr_value, AttrValue, ConfigProtoView, FunctionDefView, RecvTensorRequest, TensorProto,
};
use salus_server::error::Error;
use salus_server::frontend::eager::{enqueue_response, queue_items, tensor_name};
use salus_server::runtime::eager_devices::DeviceNames;
use salus_server::runtime::eager_job::{
    map_function, FunctionRefusal, Item, ItemOutput, OpInput, OpRequest,
};
use salus_server::runtime::session_config::{session_config, SessionDefaults};
use salus_server::sched::Hints;
use salus_server::tenant::TenantRules;
use salus_server::tf::Tensor;
use salus_server::wire;

/// Largest tensor an input may create here (the server's default is 2 GiB): a
/// proto claiming more must be refused before anything is allocated.
const TENSOR_LIMIT: u64 = 1 << 20;

/// FunctionDef.node_def and NodeDef.device field numbers (as in runtime/eager_functions.rs).
const FUNCTION_NODE_DEF_FIELD: u64 = 3;
const NODE_DEVICE_FIELD: u64 = 4;

/// ConfigProto fields `session_config` must drop: the client's devices and
/// cluster (1, 4, 13, 14, 17).
const CLIENT_ONLY_FIELDS: [u64; 5] = [1, 4, 13, 14, 17];

/// The local context's prefix every mapped device of a named job gets.
const LOCAL_PREFIX: &str = "/job:localhost/replica:0/task:0";

#[derive(Clone, Copy, Debug)]
enum Kind {
    Enqueue,
    CreateContext,
    RunComponentFunction,
    RecvTensor,
    KeepAlive,
    CloseContext,
    WaitQueueDone,
    UpdateContext,
}

const KINDS: [Kind; 8] = [
    Kind::Enqueue,
    Kind::CreateContext,
    Kind::RunComponentFunction,
    Kind::RecvTensor,
    Kind::KeepAlive,
    Kind::CloseContext,
    Kind::WaitQueueDone,
    Kind::UpdateContext,
];

/// How the client may name this server, as `create_context` builds it from
/// the ServerDef: the stock `connect_to_cluster` ("worker", with the client's
/// "localhost"), a server on replica 1 / task 2 of job "ps", and a server whose
/// cluster calls it "localhost" (the job the local context uses too).
fn device_names(choice: u8) -> DeviceNames {
    match choice % 3 {
        0 => DeviceNames::new("worker", 0, 0, vec!["worker".into(), "localhost".into()]),
        1 => DeviceNames::new("ps", 1, 2, vec!["chief".into(), "ps".into()]),
        _ => DeviceNames::new("localhost", 0, 0, vec!["localhost".into(), "client".into()]),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    // tonic hands the codec a contiguous buffer; prost copies `bytes` fields
    // out of it as `Bytes`, like here.
    let body = Bytes::copy_from_slice(body);
    let kind = KINDS[usize::from(selector) % KINDS.len()];
    let names = device_names(selector / KINDS.len() as u8);
    match kind {
        Kind::Enqueue => {
            if let Ok(req) = EnqueueRequest::decode(body) {
                enqueue(req, &names);
            }
        }
        Kind::CreateContext => {
            if let Ok(req) = CreateContextRequest::decode(body) {
                report(create_context(req));
            }
        }
        Kind::RunComponentFunction => {
            if let Ok(req) = RunComponentFunctionRequest::decode(body) {
                let name = req.operation.map(|o| o.name).unwrap_or_default();
                report::<()>(Err(Error::Unimplemented(format!(
                    "RunComponentFunction ({name}): not served"
                ))));
            }
        }
        Kind::RecvTensor => {
            if let Ok(req) = RecvTensorRequest::decode(body) {
                recv_tensor(&req.rendezvous_key);
            }
        }
        Kind::KeepAlive => drop(KeepAliveRequest::decode(body)),
        Kind::CloseContext => drop(CloseContextRequest::decode(body)),
        Kind::WaitQueueDone => drop(WaitQueueDoneRequest::decode(body)),
        Kind::UpdateContext => drop(UpdateContextRequest::decode(body)),
    }
});

/// The context-free part of `enqueue` and of the job's `run_item`.
fn enqueue(req: EnqueueRequest, names: &DeviceNames) {
    let count = req.queue.len();
    let items = match queue_items(req.queue) {
        Ok(items) => items,
        Err(err) => return report::<()>(Err(err)),
    };
    assert_eq!(items.len(), count, "one item per queue item");
    let rules = TenantRules::default();
    let mut outputs = Vec::with_capacity(items.len());
    for item in &items {
        let mut output = ItemOutput::default();
        match item {
            Item::Execute(op) => report(execute(op, names, &rules, &mut output)),
            Item::RegisterFunction {
                function_def,
                library,
            } => {
                for def in library.iter().chain(std::iter::once(function_def)) {
                    report(register_function(def, names, &rules));
                }
            }
            Item::SendTensors {
                op_id,
                tensors,
                device,
            } => {
                report(local_device(names, device));
                for (i, proto) in tensors.iter().enumerate() {
                    if let Some(dims) = build_tensor(&format!("send_tensor {op_id}:{i}"), proto) {
                        output.shapes.push(dims);
                    }
                }
            }
            Item::Decref { .. }
            | Item::RemoveFunction(_)
            | Item::CleanupFunction
            | Item::Sync
            | Item::SentEarly(_) => {}
        }
        outputs.push(output);
    }
    let shapes: Vec<Vec<Vec<i64>>> = outputs.iter().map(|o| o.shapes.clone()).collect();
    let response = enqueue_response(outputs);
    assert_eq!(response.queue_response.len(), items.len());
    for (queue_response, dims) in response.queue_response.iter().zip(shapes) {
        let sent: Vec<Vec<i64>> = queue_response
            .shape
            .iter()
            .map(|s| s.dim.iter().map(|d| d.size).collect())
            .collect();
        assert_eq!(sent, dims, "response shapes are the outputs' shapes");
    }
}

/// An op's checks before TensorFlow runs it.
fn execute(
    op: &OpRequest,
    names: &DeviceNames,
    rules: &TenantRules,
    output: &mut ItemOutput,
) -> Result<(), Error> {
    assert!(!op.name.is_empty(), "queue_items refuses unnamed ops");
    assert!(
        op.attrs.windows(2).all(|w| w[0].0 <= w[1].0),
        "attributes are sorted"
    );
    if matches!(op.name.as_str(), "_Send" | "_HostSend") {
        // The job's `send_tensor_name`: the attribute is decoded, never trusted.
        if let Some((_, attr)) = op.attrs.iter().find(|(k, _)| k == "tensor_name") {
            if let Ok(AttrValue {
                value: Some(attr_value::Value::S(s)),
            }) = AttrValue::decode(attr.as_ref())
            {
                drop(String::from_utf8_lossy(&s));
            }
        }
    }
    rules.check_eager_op(&op.name)?;
    local_device(names, &op.device)?;
    for input in &op.inputs {
        if let OpInput::Tensor(proto) = input {
            let name = format!("input of op {} ({})", op.id, op.name);
            if let Some(dims) = build_tensor(&name, proto) {
                output.shapes.push(dims);
            }
        }
    }
    Ok(())
}

/// `EagerJob::local_device`, and what a mapped name promises.
fn local_device(names: &DeviceNames, device: &str) -> Result<String, Error> {
    let local = names
        .to_local(device)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    if has_job(device) {
        assert!(local.starts_with(LOCAL_PREFIX), "{device:?} -> {local:?}");
        // The client's name of the local device maps back to it.
        let client = names.to_client(&local);
        assert!(
            client.starts_with(&names.client_prefix()),
            "{local:?} -> {client:?}"
        );
        assert_eq!(names.to_local(&client).as_deref(), Ok(local.as_str()));
        assert_eq!(names.node_to_local(&local), None, "{local:?} is local");
    } else {
        assert_eq!(local, device, "a name without a job is kept");
    }
    Ok(local)
}

/// Whether a device name names a job (the last `job:` part wins, as in
/// `eager_devices::parse`).
fn has_job(device: &str) -> bool {
    device.split('/').any(|p| p.starts_with("job:"))
}

/// `EagerJob::register_function` up to TensorFlow's `add_function`: the
/// server's own `map_function`, then the invariants of its result.
fn register_function(def: &[u8], names: &DeviceNames, rules: &TenantRules) -> Result<(), Error> {
    let function = match map_function(def, names, rules) {
        Ok(function) => function,
        Err(FunctionRefusal::Malformed(error)) => return Err(error),
        Err(FunctionRefusal::Refused { name, error }) => {
            assert!(!name.is_empty(), "a refused function is named");
            return Err(error);
        }
    };
    let view = FunctionDefView::decode(def).expect("a mapped FunctionDef decodes");
    let name = view
        .signature
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    assert_eq!(function.name, name);
    assert_eq!(
        function.without_outputs,
        view.signature
            .as_ref()
            .is_some_and(|s| s.output_arg.is_empty())
    );
    let mapped = function.mapped;

    // Only node devices changed: every other byte is the client's.
    let strip = |bytes: &[u8]| {
        wire::strip_nested_fields(bytes, FUNCTION_NODE_DEF_FIELD, &[NODE_DEVICE_FIELD])
            .expect("a FunctionDef the rewrite walked can be stripped")
    };
    assert_eq!(strip(&mapped), strip(def), "non-device bytes changed");
    let rewritten = FunctionDefView::decode(mapped.as_slice()).expect("the rewrite decodes");
    assert_eq!(rewritten.signature, view.signature);
    assert_eq!(rewritten.node_def.len(), view.node_def.len());
    for (new, old) in rewritten.node_def.iter().zip(&view.node_def) {
        assert_eq!(new.name, old.name);
        assert_eq!(new.op, old.op);
        assert_eq!(new.input, old.input);
        assert_eq!(new.attr, old.attr);
        let expected = names
            .node_to_local(&old.device)
            .unwrap_or_else(|| old.device.clone());
        assert_eq!(new.device, expected, "device of node {:?}", old.name);
        if has_job(&new.device) {
            assert_eq!(
                names.node_to_local(&new.device),
                None,
                "{:?} is local",
                new.device
            );
        }
    }
    Ok(())
}

/// A tensor built as the job builds inputs and sent tensors; its dims when built.
fn build_tensor(name: &str, proto: &TensorProto) -> Option<Vec<i64>> {
    match Tensor::from_proto(proto, TENSOR_LIMIT) {
        Ok(tensor) => {
            assert!(tensor.byte_size() <= TENSOR_LIMIT);
            Some(tensor.dims())
        }
        Err(err) => {
            report::<()>(Err(Error::tensor(name, err)));
            None
        }
    }
}

/// The pure part of `Eager::create_context`.
fn create_context(req: CreateContextRequest) -> Result<(), Error> {
    let server_def = req.server_def.unwrap_or_default();
    if server_def.job_name.is_empty() {
        return Err(Error::InvalidArgument(
            "CreateContext: server_def.job_name is empty".into(),
        ));
    }
    let (config, metadata_name) = session_config(
        &server_def.default_session_config,
        SessionDefaults::default(),
    )?;
    for field in CLIENT_ONLY_FIELDS {
        assert_eq!(wire::has_field(&config, field), Ok(false), "field {field}");
    }
    let view =
        ConfigProtoView::decode(config.as_slice()).expect("the server's ConfigProto decodes");
    assert!(
        view.experimental.and_then(|e| e.session_metadata).is_none(),
        "session metadata reaches TensorFlow"
    );
    let hints = Hints::parse(&metadata_name)?;
    assert!(metadata_name.starts_with(&hints.name));
    let other_jobs = server_def
        .cluster
        .as_ref()
        .map(|c| c.job.iter().map(|j| j.name.clone()).collect())
        .unwrap_or_default();
    let names = DeviceNames::new(
        &server_def.job_name,
        server_def.replica,
        server_def.task_index,
        other_jobs,
    );
    // The server's devices, as the response renames them for the client.
    for local in [
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:GPU:0",
    ] {
        let client = names.to_client(local);
        assert!(client.starts_with(&names.client_prefix()));
        // A job name the client's device names can carry maps back.
        if !server_def.job_name.contains('/') {
            assert_eq!(names.to_local(&client).as_deref(), Ok(local), "{client:?}");
        }
    }
    Ok(())
}

/// `Worker::recv_tensor`'s parsing of the rendezvous key.
fn recv_tensor(key: &str) {
    match tensor_name(key) {
        Ok(name) => {
            assert!(
                !name.is_empty() && !name.contains(';'),
                "{key:?} -> {name:?}"
            );
            assert_eq!(key.split(';').nth(3), Some(name));
            assert_eq!(key.matches(';').count(), 4);
        }
        Err(err) => report::<()>(Err(err)),
    }
}

/// Renders an error as the gRPC response the handler would send.
fn report<T>(result: Result<T, Error>) {
    if let Err(err) = result {
        let status = tonic::Status::from(err);
        drop(status.into_http::<()>());
    }
}
