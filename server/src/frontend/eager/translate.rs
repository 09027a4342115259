//! Protocol messages <-> runtime items for the eager front end.

use salus_proto::tensorflow::eager::{
    operation, queue_item, EnqueueResponse, Operation, QueueItem, QueueResponse,
};

use crate::error::{Error, Result};
use crate::runtime::eager_job::{Item, ItemOutput, OpInput, OpRequest};
use crate::tf::tensor::shape_proto;

/// The runtime items of one request, in order.
pub fn queue_items(queue: Vec<QueueItem>) -> Result<Vec<Item>> {
    queue
        .into_iter()
        .enumerate()
        .map(|(i, item)| queue_item(i, item))
        .collect()
}

fn queue_item(index: usize, item: QueueItem) -> Result<Item> {
    use queue_item::Item as Q;
    Ok(match item.item {
        None => {
            return Err(Error::InvalidArgument(format!(
                "queue item {index} is empty"
            )))
        }
        Some(Q::Operation(op)) => Item::Execute(op_request(op)?),
        Some(Q::HandleToDecref(h)) => Item::Decref {
            op_id: h.op_id,
            output: h.output_num,
        },
        Some(Q::SendTensor(send)) => Item::SendTensors {
            op_id: send.op_id,
            tensors: send.tensors,
            device: send.device_name,
        },
        Some(Q::RegisterFunction(register)) => Item::RegisterFunction {
            function_def: register.function_def,
            library: register.library.map(|l| l.function).unwrap_or_default(),
        },
        Some(Q::RemoveFunction(remove)) => Item::RemoveFunction(remove.function_name),
        Some(Q::CleanupFunction(_)) => Item::CleanupFunction,
        Some(Q::SyncRemoteExecutorForStream(_)) => Item::Sync,
        Some(Q::SendPackedHandle(_)) => return Err(Error::Unimplemented(
            "send_packed_handle (packed variables of multi-device functions, e.g. TPU replicas) \
                 is not served by Salus"
                .into(),
        )),
    })
}

fn op_request(op: Operation) -> Result<OpRequest> {
    if op.name.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "operation {} has no name",
            op.id
        )));
    }
    let inputs = op
        .op_inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| match input.item {
            Some(operation::input::Item::RemoteHandle(h)) => Ok(OpInput::Handle {
                op_id: h.op_id,
                output: h.output_num,
            }),
            Some(operation::input::Item::Tensor(t)) => Ok(OpInput::Tensor(t)),
            None => Err(Error::InvalidArgument(format!(
                "input {i} of operation {} ({}) is empty",
                op.id, op.name
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut attrs: Vec<_> = op.attrs.into_iter().collect();
    // Deterministic order (the protocol's map has none).
    attrs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(OpRequest {
        id: op.id,
        name: op.name,
        inputs,
        attrs,
        device: op.device,
        is_function: op.is_function || op.is_component_function,
    })
}

/// One queue response per item: output shapes, and devices for function calls.
pub fn enqueue_response(outputs: Vec<ItemOutput>) -> EnqueueResponse {
    EnqueueResponse {
        queue_response: outputs
            .into_iter()
            .map(|out| QueueResponse {
                shape: out.shapes.into_iter().map(shape_proto).collect(),
                device: out.devices,
                tensor: Vec::new(),
            })
            .collect(),
    }
}
