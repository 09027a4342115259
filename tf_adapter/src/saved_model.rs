//! TF_LoadSessionFromSavedModel through the server.
//!
//! The model's files are on the client and the server confines file access, so the
//! server's session cannot run the model's restore op. Instead the model is loaded
//! locally as usual (TensorFlow reads the checkpoint), every variable's value is fetched
//! from that local session, and a session on the server is given the same graph and
//! those values (one Placeholder + Assign/AssignVariableOp per variable, added to the
//! program's graph under `salus_shim/`). The model's init op then runs on the server.
//! Functions of the graph's library that hold checkpoint ops (a TF2 SavedModel's traced
//! save/restore functions) are replaced in the graph by stand-ins that fail when called
//! (checkpoint_stub): the server refuses them, and the shipped values make them unnecessary.
//! Models with asset files are refused with an exact message: their init op reads the
//! files by path, on the server.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::checkpoint_stub::refusing_stub;
use crate::redirect::{Redirect, Refusal, RemoteOptions};
use crate::tf::{
    self, real, OwnedStatus, TF_Buffer, TF_Function, TF_Graph, TF_Operation, TF_Output, TF_Session,
    TF_SessionOptions, TF_Status, TF_Tensor,
};
use crate::wire::{fields, submessages, MalformedProto};

/// The arguments of one TF_LoadSessionFromSavedModel call.
pub struct LoadRequest {
    pub session_options: *const TF_SessionOptions,
    pub run_options: *const TF_Buffer,
    pub export_dir: *const c_char,
    pub tags: *const *const c_char,
    pub tags_len: c_int,
    pub graph: *mut TF_Graph,
    pub meta_graph_def: *mut TF_Buffer,
    pub status: *mut TF_Status,
}

type LoadFn = unsafe extern "C" fn(
    *const TF_SessionOptions,
    *const TF_Buffer,
    *const c_char,
    *const *const c_char,
    c_int,
    *mut TF_Graph,
    *mut TF_Buffer,
    *mut TF_Status,
) -> *mut TF_Session;

impl LoadRequest {
    /// TensorFlow's own load, with the program's arguments.
    pub unsafe fn load_locally(&self, real_load: LoadFn) -> *mut TF_Session {
        self.load_with(real_load, self.meta_graph_def)
    }

    unsafe fn load_with(
        &self,
        real_load: LoadFn,
        meta_graph_def: *mut TF_Buffer,
    ) -> *mut TF_Session {
        real_load(
            self.session_options,
            self.run_options,
            self.export_dir,
            self.tags,
            self.tags_len,
            self.graph,
            meta_graph_def,
            self.status,
        )
    }

    fn export_dir(&self) -> String {
        if self.export_dir.is_null() {
            return String::new();
        }
        // SAFETY: a NUL-terminated path from the program.
        unsafe {
            CStr::from_ptr(self.export_dir)
                .to_string_lossy()
                .into_owned()
        }
    }
}

/// Closes and deletes a session on drop unless it was handed to the program.
struct SessionGuard(*mut TF_Session);

impl SessionGuard {
    fn release(mut self) -> *mut TF_Session {
        std::mem::replace(&mut self.0, std::ptr::null_mut())
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        let (Ok(status), Ok(close), Ok(delete)) = (
            OwnedStatus::new(),
            real::TF_CloseSession(),
            real::TF_DeleteSession(),
        ) else {
            return;
        };
        // SAFETY: a session made by the shim and not given out; closed and deleted once.
        unsafe {
            close(self.0, status.ptr());
            delete(self.0, status.ptr());
        }
    }
}

/// Tensors the shim received from TF_SessionRun; deleted on drop.
struct Tensors(Vec<*mut TF_Tensor>);

impl Drop for Tensors {
    fn drop(&mut self) {
        if let Ok(delete) = real::TF_DeleteTensor() {
            for &t in &self.0 {
                if !t.is_null() {
                    // SAFETY: owned by the shim (TF_SessionRun outputs), deleted once.
                    unsafe { delete(t) };
                }
            }
        }
    }
}

/// A TF_Buffer the shim owns; deleted on drop.
struct OwnedBuffer(*mut TF_Buffer);

impl OwnedBuffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: a live buffer filled by TensorFlow (data/length describe its contents).
        unsafe {
            let buf = &*self.0;
            if buf.data.is_null() || buf.length == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(buf.data.cast::<u8>(), buf.length)
            }
        }
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        if let Ok(delete) = real::TF_DeleteBuffer() {
            // SAFETY: made by TF_NewBuffer, deleted once.
            unsafe { delete(self.0) };
        }
    }
}

fn failed(code: c_int, message: impl Into<String>) -> Refusal {
    Refusal::new(code, message)
}

fn tf_error(what: &str) -> impl Fn((c_int, String)) -> Refusal + '_ {
    move |(code, message)| failed(code, format!("{what}: {message}"))
}

/// How a variable's value is read and written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum VariableKind {
    /// VariableV2 / Variable (TF1 ref variables): fetch the output, `Assign`.
    Ref,
    /// VarHandleOp (resource variables): `ReadVariableOp`, `AssignVariableOp`.
    Resource,
}

fn variable_kind(op_type: &str) -> Option<VariableKind> {
    match op_type {
        "VariableV2" | "Variable" => Some(VariableKind::Ref),
        "VarHandleOp" => Some(VariableKind::Resource),
        _ => None,
    }
}

struct Variable {
    op: *mut TF_Operation,
    kind: VariableKind,
    dtype: c_int,
}

/// One variable's transfer: what is fetched locally and what is run remotely.
struct Transfer {
    read: TF_Output,
    value: TF_Output,
    assign: *mut TF_Operation,
}

static SHIP_COUNTER: AtomicUsize = AtomicUsize::new(0);
/// Feeds per remote run, in bytes: keeps each RunStep request well under gRPC's limits.
const FEED_BATCH_BYTES: usize = 64 << 20;

pub unsafe fn load_on_server(
    request: &LoadRequest,
    real_load: LoadFn,
    redirect: &Redirect,
) -> Result<*mut TF_Session, Refusal> {
    let started = Instant::now();
    let export_dir = request.export_dir();
    // The MetaGraphDef says which init op to run and whether the model has asset files.
    let meta = OwnedBuffer(real::TF_NewBuffer()?());
    let local = SessionGuard(request.load_with(real_load, meta.0));
    if local.0.is_null() {
        tf::status_result(request.status).map_err(tf_error(&format!(
            "loading the SavedModel {export_dir} on the client"
        )))?;
        return Err(failed(
            tf::TF_INTERNAL,
            "TF_LoadSessionFromSavedModel returned no session",
        ));
    }
    if !request.meta_graph_def.is_null() {
        copy_into_program_buffer(request.meta_graph_def, meta.bytes())?;
    }
    let info = MetaGraphInfo::parse(meta.bytes()).map_err(|_| {
        failed(
            tf::TF_INTERNAL,
            "the SavedModel's MetaGraphDef could not be read",
        )
    })?;
    if info.has_assets {
        return Err(failed(
            tf::TF_FAILED_PRECONDITION,
            format!(
                "the SavedModel {export_dir} has asset files (e.g. vocabularies), which its init op reads \
                 by path on the server, where the client's files are not reachable: load it with SALUS_SERVER \
                 unset, or export the model without assets (tables built from constants)"
            ),
        ));
    }
    let loaded_at = Instant::now();

    let graph = request.graph;
    let variables = find_variables(graph)?;
    let transfers = add_transfer_ops(graph, &variables)?;
    let status = OwnedStatus::new()?;
    let session_run = real::TF_SessionRun()?;

    // Fetch every value from the local session in one run.
    let reads: Vec<TF_Output> = transfers.iter().map(|t| t.read).collect();
    let mut values = Tensors(vec![std::ptr::null_mut(); reads.len()]);
    if !reads.is_empty() {
        session_run(
            local.0,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            reads.as_ptr(),
            values.0.as_mut_ptr(),
            reads.len() as c_int,
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            status.ptr(),
        );
        status
            .check()
            .map_err(tf_error("reading the restored variables on the client"))?;
    }
    drop(local); // the values are in `values`; the local session's memory goes now

    let removed_functions = remove_checkpoint_functions(graph)?;
    let remote_options = RemoteOptions::new(redirect)?;
    let remote = SessionGuard(real::TF_NewSession()?(
        graph,
        remote_options.ptr(),
        status.ptr(),
    ));
    status
        .check()
        .map_err(tf_error("creating the session on the Salus server"))?;
    if remote.0.is_null() {
        return Err(failed(tf::TF_INTERNAL, "TF_NewSession returned no session"));
    }

    let byte_size = real::TF_TensorByteSize()?;
    let mut shipped_bytes = 0usize;
    let mut batch_start = 0;
    while batch_start < transfers.len() {
        let mut batch_end = batch_start;
        let mut batch_bytes = 0usize;
        while batch_end < transfers.len()
            && (batch_end == batch_start || batch_bytes < FEED_BATCH_BYTES)
        {
            batch_bytes += byte_size(values.0[batch_end]);
            batch_end += 1;
        }
        let feeds: Vec<TF_Output> = transfers[batch_start..batch_end]
            .iter()
            .map(|t| t.value)
            .collect();
        let assigns: Vec<*const TF_Operation> = transfers[batch_start..batch_end]
            .iter()
            .map(|t| t.assign.cast_const())
            .collect();
        session_run(
            remote.0,
            std::ptr::null(),
            feeds.as_ptr(),
            values.0[batch_start..batch_end].as_ptr(),
            feeds.len() as c_int,
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            assigns.as_ptr(),
            assigns.len() as c_int,
            std::ptr::null_mut(),
            status.ptr(),
        );
        status.check().map_err(tf_error(
            "assigning the variables' values on the Salus server",
        ))?;
        shipped_bytes += batch_bytes;
        batch_start = batch_end;
    }

    if let Some(init_op) = &info.init_op {
        let name = CString::new(init_op.as_str())
            .map_err(|_| failed(tf::TF_INTERNAL, "the init op's name has a NUL byte"))?;
        let op = real::TF_GraphOperationByName()?(graph, name.as_ptr());
        if op.is_null() {
            return Err(failed(
                tf::TF_INTERNAL,
                format!("the SavedModel's init op {init_op} is not in the graph"),
            ));
        }
        let targets = [op.cast_const()];
        session_run(
            remote.0,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            targets.as_ptr(),
            1,
            std::ptr::null_mut(),
            status.ptr(),
        );
        status.check().map_err(tf_error(&format!(
            "running the init op {init_op} on the Salus server"
        )))?;
    }

    if redirect.settings.verbose {
        eprintln!(
            "salus: SavedModel {export_dir}: loaded on the client in {:.1} ms, {} variables ({} bytes) \
             shipped to {} in {:.1} ms ({} checkpoint functions replaced in the graph)",
            (loaded_at - started).as_secs_f64() * 1e3,
            transfers.len(),
            shipped_bytes,
            redirect.settings.server,
            loaded_at.elapsed().as_secs_f64() * 1e3,
            removed_functions,
        );
    }
    Ok(remote.release())
}

/// The program asked for the MetaGraphDef: give it a copy it frees with its own TF_DeleteBuffer.
unsafe fn copy_into_program_buffer(target: *mut TF_Buffer, bytes: &[u8]) -> Result<(), Refusal> {
    unsafe extern "C" fn free_copy(data: *mut std::ffi::c_void, _len: usize) {
        libc::free(data);
    }
    let target = &mut *target;
    if let Some(dealloc) = target.data_deallocator.take() {
        dealloc(target.data.cast_mut(), target.length);
    }
    let copy = libc::malloc(bytes.len().max(1));
    if copy.is_null() {
        return Err(failed(
            tf::TF_INTERNAL,
            "out of memory copying the MetaGraphDef",
        ));
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), copy.cast::<u8>(), bytes.len());
    target.data = copy;
    target.length = bytes.len();
    target.data_deallocator = Some(free_copy);
    Ok(())
}

unsafe fn c_str(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

unsafe fn find_variables(graph: *mut TF_Graph) -> Result<Vec<Variable>, Refusal> {
    let next = real::TF_GraphNextOperation()?;
    let op_type = real::TF_OperationOpType()?;
    let get_type = real::TF_OperationGetAttrType()?;
    let status = OwnedStatus::new()?;
    let mut pos = 0usize;
    let mut out = Vec::new();
    loop {
        let op = next(graph, &mut pos);
        if op.is_null() {
            return Ok(out);
        }
        let Some(kind) = variable_kind(&c_str(op_type(op))) else {
            continue;
        };
        let mut dtype: c_int = 0;
        get_type(op, c"dtype".as_ptr(), &mut dtype, status.ptr());
        status
            .check()
            .map_err(tf_error("reading a variable's dtype"))?;
        out.push(Variable { op, kind, dtype });
    }
}

/// Builds one operation; `inputs` are outputs of existing ones.
unsafe fn add_op(
    graph: *mut TF_Graph,
    op_type: &CStr,
    name: &str,
    inputs: &[TF_Output],
    dtype_attr: &CStr,
    dtype: c_int,
) -> Result<*mut TF_Operation, Refusal> {
    let name_c = CString::new(name).map_err(|_| failed(tf::TF_INTERNAL, "NUL in an op name"))?;
    let desc = real::TF_NewOperation()?(graph, op_type.as_ptr(), name_c.as_ptr());
    for &input in inputs {
        real::TF_AddInput()?(desc, input);
    }
    real::TF_SetAttrType()?(desc, dtype_attr.as_ptr(), dtype);
    let status = OwnedStatus::new()?;
    // TF_FinishOperation frees the description whatever its outcome.
    let op = real::TF_FinishOperation()?(desc, status.ptr());
    status
        .check()
        .map_err(tf_error(&format!("adding {name} to the graph")))?;
    Ok(op)
}

unsafe fn add_transfer_ops(
    graph: *mut TF_Graph,
    variables: &[Variable],
) -> Result<Vec<Transfer>, Refusal> {
    let scope = format!(
        "salus_shim/ship{}",
        SHIP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let op_name = real::TF_OperationName()?;
    let mut out = Vec::with_capacity(variables.len());
    for (i, var) in variables.iter().enumerate() {
        let handle = TF_Output {
            oper: var.op,
            index: 0,
        };
        let var_name = c_str(op_name(var.op));
        let prefix = format!("{scope}/{i}");
        let value = add_op(
            graph,
            c"Placeholder",
            &format!("{prefix}/value"),
            &[],
            c"dtype",
            var.dtype,
        )?;
        let value = TF_Output {
            oper: value,
            index: 0,
        };
        let (read, assign) = match var.kind {
            VariableKind::Ref => {
                let assign = add_op(
                    graph,
                    c"Assign",
                    &format!("{prefix}/assign"),
                    &[handle, value],
                    c"T",
                    var.dtype,
                )
                .map_err(|r| context(r, &var_name))?;
                (handle, assign)
            }
            VariableKind::Resource => {
                let read = add_op(
                    graph,
                    c"ReadVariableOp",
                    &format!("{prefix}/read"),
                    &[handle],
                    c"dtype",
                    var.dtype,
                )
                .map_err(|r| context(r, &var_name))?;
                let assign = add_op(
                    graph,
                    c"AssignVariableOp",
                    &format!("{prefix}/assign"),
                    &[handle, value],
                    c"dtype",
                    var.dtype,
                )
                .map_err(|r| context(r, &var_name))?;
                (
                    TF_Output {
                        oper: read,
                        index: 0,
                    },
                    assign,
                )
            }
        };
        out.push(Transfer {
            read,
            value,
            assign,
        });
    }
    Ok(out)
}

/// Ops the server allows only in the graph itself, not inside functions (the server's
/// tenant::op_policy::CHECKPOINT_OPS).
const CHECKPOINT_OPS: [&str; 7] = [
    "SaveV2",
    "RestoreV2",
    "Save",
    "SaveSlices",
    "Restore",
    "RestoreSlice",
    "MergeV2Checkpoints",
];
/// FunctionDef.node_def (3); NodeDef.op (2).
const FUNCTION_NODE_DEF_FIELD: u64 = 3;
const NODE_OP_FIELD: u64 = 2;

/// Whether a serialized FunctionDef runs a checkpoint op.
fn function_has_checkpoint_ops(function_def: &[u8]) -> Result<bool, MalformedProto> {
    for node in submessages(function_def, FUNCTION_NODE_DEF_FIELD)? {
        if let Some(op) = first_string(node, NODE_OP_FIELD)? {
            if CHECKPOINT_OPS.contains(&op.as_str()) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// TF_Functions from TF_GraphGetFunctions; deleted on drop.
struct Functions(Vec<*mut TF_Function>);

impl Drop for Functions {
    fn drop(&mut self) {
        if let Ok(delete) = real::TF_DeleteFunction() {
            for &f in &self.0 {
                // SAFETY: owned by the shim (TF_GraphGetFunctions gives ownership), deleted once.
                unsafe { delete(f) };
            }
        }
    }
}

/// Replaces the library functions that hold checkpoint ops with refusing stand-ins; returns how many.
unsafe fn remove_checkpoint_functions(graph: *mut TF_Graph) -> Result<usize, Refusal> {
    let count = real::TF_GraphNumFunctions()?(graph);
    if count <= 0 {
        return Ok(0);
    }
    let status = OwnedStatus::new()?;
    let mut functions = Functions(vec![std::ptr::null_mut(); count as usize]);
    let got = real::TF_GraphGetFunctions()?(graph, functions.0.as_mut_ptr(), count, status.ptr());
    status
        .check()
        .map_err(tf_error("listing the graph's functions"))?;
    functions.0.truncate(got.max(0) as usize);
    let mut replaced = Vec::new();
    for &function in &functions.0 {
        let def = OwnedBuffer(real::TF_NewBuffer()?());
        real::TF_FunctionToFunctionDef()?(function, def.0, status.ptr());
        status
            .check()
            .map_err(tf_error("reading a graph function"))?;
        let has = function_has_checkpoint_ops(def.bytes()).map_err(|_| {
            failed(
                tf::TF_INTERNAL,
                "a graph function's FunctionDef could not be read",
            )
        })?;
        if has {
            let name = CStr::from_ptr(real::TF_FunctionName()?(function)).to_owned();
            let stub = refusing_stub(def.bytes()).map_err(|e| {
                failed(
                    tf::TF_FAILED_PRECONDITION,
                    format!("the SavedModel's function {name:?} saves or restores a checkpoint and cannot be \
                             replaced for the server ({e:?}): load the model with SALUS_SERVER unset"),
                )
            })?;
            replaced.push((name, stub));
        }
    }
    for (name, stub) in &replaced {
        real::TF_GraphRemoveFunction()?(graph, name.as_ptr(), status.ptr());
        status.check().map_err(tf_error(&format!(
            "removing the checkpoint function {name:?}"
        )))?;
        let stub_function = Functions(vec![real::TF_FunctionImportFunctionDef()?(
            stub.as_ptr().cast(),
            stub.len(),
            status.ptr(),
        )]);
        status
            .check()
            .map_err(tf_error(&format!("building the stand-in for {name:?}")))?;
        real::TF_GraphCopyFunction()?(graph, stub_function.0[0], std::ptr::null(), status.ptr());
        status
            .check()
            .map_err(tf_error(&format!("adding the stand-in for {name:?}")))?;
    }
    Ok(replaced.len())
}

fn context(refusal: Refusal, variable: &str) -> Refusal {
    Refusal {
        code: refusal.code,
        message: format!("{} (variable {variable})", refusal.message),
    }
}

/// What the shim needs from a MetaGraphDef.
#[derive(Debug, Default, PartialEq, Eq)]
struct MetaGraphInfo {
    /// The op TensorFlow's loader runs after restoring (tables, TF2 init functions).
    init_op: Option<String>,
    has_assets: bool,
}

// MetaGraphDef: collection_def (4) map<string, CollectionDef>, signature_def (5)
// map<string, SignatureDef>, asset_file_def (6). Map entries: key (1), value (2).
const COLLECTION_DEF_FIELD: u64 = 4;
const SIGNATURE_DEF_FIELD: u64 = 5;
const ASSET_FILE_DEF_FIELD: u64 = 6;
/// CollectionDef.node_list (1) . value (1); SignatureDef.outputs (2); TensorInfo.name (1).
const NODE_LIST_FIELD: u64 = 1;
const SIGNATURE_OUTPUTS_FIELD: u64 = 2;
/// The loader's order (tensorflow/cc/saved_model/loader_util.cc): the TF2 init signature,
/// then the main op collection, then the legacy one.
const INIT_OP_SIGNATURE_KEY: &str = "__saved_model_init_op";
const INIT_OP_COLLECTIONS: [&str; 2] = ["saved_model_main_op", "legacy_init_op"];

/// `(key, value)` of each entry of a map field.
fn map_entries(buf: &[u8], number: u64) -> Result<Vec<(String, &[u8])>, MalformedProto> {
    let mut out = Vec::new();
    for entry in submessages(buf, number)? {
        let mut key = String::new();
        let mut value: &[u8] = &[];
        for f in fields(entry)? {
            match (f.number, f.bytes) {
                (1, Some(k)) => key = String::from_utf8_lossy(k).into_owned(),
                (2, Some(v)) => value = v,
                _ => {}
            }
        }
        out.push((key, value));
    }
    Ok(out)
}

fn first_string(buf: &[u8], number: u64) -> Result<Option<String>, MalformedProto> {
    Ok(submessages(buf, number)?
        .first()
        .map(|b| String::from_utf8_lossy(b).into_owned()))
}

/// "name:0" or "^name" -> "name".
fn op_name_of(tensor: &str) -> String {
    let name = tensor.trim_start_matches('^');
    name.split(':').next().unwrap_or(name).to_string()
}

impl MetaGraphInfo {
    fn parse(meta: &[u8]) -> Result<Self, MalformedProto> {
        let has_assets = !submessages(meta, ASSET_FILE_DEF_FIELD)?.is_empty();
        let mut init_op = None;
        for (key, signature) in map_entries(meta, SIGNATURE_DEF_FIELD)? {
            if key == INIT_OP_SIGNATURE_KEY {
                if let Some((_, info)) = map_entries(signature, SIGNATURE_OUTPUTS_FIELD)?.first() {
                    init_op = first_string(info, 1)?.map(|t| op_name_of(&t));
                }
            }
        }
        if init_op.is_none() {
            let collections = map_entries(meta, COLLECTION_DEF_FIELD)?;
            for wanted in INIT_OP_COLLECTIONS {
                let found = collections.iter().find(|(k, _)| k == wanted);
                if let Some((_, collection)) = found {
                    if let Some(list) = submessages(collection, NODE_LIST_FIELD)?.first() {
                        init_op = first_string(list, 1)?.map(|t| op_name_of(&t));
                    }
                }
                if init_op.is_some() {
                    break;
                }
            }
        }
        Ok(MetaGraphInfo {
            init_op,
            has_assets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::write_len_field;

    fn entry(key: &str, value: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        write_len_field(&mut e, 1, key.as_bytes());
        write_len_field(&mut e, 2, value);
        e
    }

    fn node_list(names: &[&str]) -> Vec<u8> {
        let mut list = Vec::new();
        for n in names {
            write_len_field(&mut list, 1, n.as_bytes());
        }
        let mut collection = Vec::new();
        write_len_field(&mut collection, NODE_LIST_FIELD, &list);
        collection
    }

    #[test]
    fn init_op_from_the_tf2_signature_first() {
        let mut info = Vec::new();
        write_len_field(&mut info, 1, b"NoOp:0");
        let mut signature = Vec::new();
        write_len_field(
            &mut signature,
            SIGNATURE_OUTPUTS_FIELD,
            &entry("__saved_model_init_op", &info),
        );
        let mut meta = Vec::new();
        write_len_field(
            &mut meta,
            COLLECTION_DEF_FIELD,
            &entry("saved_model_main_op", &node_list(&["main"])),
        );
        write_len_field(
            &mut meta,
            SIGNATURE_DEF_FIELD,
            &entry("serving_default", &[]),
        );
        write_len_field(
            &mut meta,
            SIGNATURE_DEF_FIELD,
            &entry(INIT_OP_SIGNATURE_KEY, &signature),
        );
        let parsed = MetaGraphInfo::parse(&meta).unwrap();
        assert_eq!(
            parsed,
            MetaGraphInfo {
                init_op: Some("NoOp".into()),
                has_assets: false
            }
        );
    }

    #[test]
    fn init_op_from_collections_in_the_loaders_order() {
        let mut meta = Vec::new();
        write_len_field(
            &mut meta,
            COLLECTION_DEF_FIELD,
            &entry("legacy_init_op", &node_list(&["^legacy"])),
        );
        assert_eq!(
            MetaGraphInfo::parse(&meta).unwrap().init_op.as_deref(),
            Some("legacy")
        );
        write_len_field(
            &mut meta,
            COLLECTION_DEF_FIELD,
            &entry("saved_model_main_op", &node_list(&["main:0"])),
        );
        assert_eq!(
            MetaGraphInfo::parse(&meta).unwrap().init_op.as_deref(),
            Some("main")
        );
        write_len_field(&mut meta, ASSET_FILE_DEF_FIELD, b"\x0a\x00");
        assert!(MetaGraphInfo::parse(&meta).unwrap().has_assets);
        assert_eq!(MetaGraphInfo::parse(&[]).unwrap(), MetaGraphInfo::default());
        assert!(MetaGraphInfo::parse(&[0x22, 0x05]).is_err());
    }

    #[test]
    fn checkpoint_ops_in_function_defs() {
        let node = |op: &str| {
            let mut n = Vec::new();
            write_len_field(&mut n, 1, b"node");
            write_len_field(&mut n, NODE_OP_FIELD, op.as_bytes());
            n
        };
        let mut save = Vec::new();
        write_len_field(&mut save, FUNCTION_NODE_DEF_FIELD, &node("Identity"));
        assert!(!function_has_checkpoint_ops(&save).unwrap());
        write_len_field(
            &mut save,
            FUNCTION_NODE_DEF_FIELD,
            &node("MergeV2Checkpoints"),
        );
        assert!(function_has_checkpoint_ops(&save).unwrap());
        assert!(function_has_checkpoint_ops(&[0x1a, 0x09]).is_err());
    }

    #[test]
    fn variable_kinds() {
        assert_eq!(variable_kind("VariableV2"), Some(VariableKind::Ref));
        assert_eq!(variable_kind("VarHandleOp"), Some(VariableKind::Resource));
        assert_eq!(variable_kind("ReadVariableOp"), None);
    }
}
