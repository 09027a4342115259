//! Python callbacks: the ops that call back into the Python of the script
//! that built them (PyFunc, PyFuncStateless, EagerPyFunc: `tf.py_function`,
//! `tf.numpy_function`, `Dataset.from_generator`, Keras's `PyDataset`) run
//! on the server as part of their step, and their Python runs in the script's
//! own process.
//!
//! The salus adapter gives every such op a token ending in
//! `@salus:<client id>` (a random id of the script's process) and opens a
//! `salus.v1.PythonCallbacks/Serve` stream naming that id. The op's kernel
//! (`tf::python_kernel`) sends the op's inputs down that stream and blocks,
//! as TensorFlow's own kernel blocks on the interpreter, until the script
//! answers with the outputs or the Python's error.
//!
//! Knowing a client id is what lets a stream serve those ops: it is 128 random
//! bits that only the script's process and the graphs it sent know.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use salus_proto::salus::v1::{CallbackCall, CallbackReply};
use salus_proto::tensorflow::TensorProto;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::tf::TfError;

/// What separates a token from the id of the client that serves it.
pub const TOKEN_MARK: &str = "@salus:";

/// How long an op waits for its client's stream: the adapter opens it in the
/// background when the script creates its first Python op, which may be
/// moments before the op first runs.
pub const REGISTRATION_GRACE: Duration = Duration::from_secs(20);

/// tensorflow.error.Code values used here.
const FAILED_PRECONDITION: i32 = 9;
const ABORTED: i32 = 10;

/// An op's outputs from the script, or the error its Python raised.
pub type Reply = std::result::Result<Vec<TensorProto>, TfError>;

struct Client {
    generation: u64,
    calls: mpsc::UnboundedSender<CallbackCall>,
    pending: HashMap<u64, std::sync::mpsc::SyncSender<Reply>>,
}

#[derive(Default)]
struct Inner {
    clients: HashMap<String, Client>,
    /// Clients whose stream ended (oldest first, at most `DEPARTED_KEPT`): an op
    /// of theirs fails at once instead of waiting for a stream that will not
    /// come (a generator's finalizer when a departed script's context closes).
    departed: VecDeque<String>,
    next_call: u64,
    next_generation: u64,
}

const DEPARTED_KEPT: usize = 4096;

/// The clients of this process serving their Python, by client id.
#[derive(Default)]
pub struct PythonCalls {
    inner: Mutex<Inner>,
    registered: Condvar,
}

/// This process's table (the kernels are global to TensorFlow, so is it).
pub fn python_calls() -> &'static PythonCalls {
    static CALLS: OnceLock<PythonCalls> = OnceLock::new();
    CALLS.get_or_init(PythonCalls::default)
}

/// A served client id: dropping it (the stream ended) fails the calls still
/// waiting for that client.
pub struct Registration<'a> {
    table: &'a PythonCalls,
    client: String,
    generation: u64,
}

/// Whether `id` can be a client id: 16 to 64 characters of `[A-Za-z0-9_-]`.
fn valid_client_id(id: &str) -> bool {
    (16..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The client id a token names, if it has one.
pub fn client_of(token: &str) -> Option<&str> {
    token
        .rsplit_once(TOKEN_MARK)
        .map(|(_, id)| id)
        .filter(|id| valid_client_id(id))
}

impl PythonCalls {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts serving `client`: the returned receiver yields the calls to send
    /// it. Refused if the id is malformed or already served.
    pub fn register(
        &self,
        client: &str,
    ) -> Result<(Registration<'_>, mpsc::UnboundedReceiver<CallbackCall>)> {
        if !valid_client_id(client) {
            return Err(Error::InvalidArgument(
                "a Python callback stream's first message names its client: 16 to 64 characters of \
                 [A-Za-z0-9_-]"
                    .into(),
            ));
        }
        let mut inner = self.lock();
        if inner.clients.contains_key(client) {
            return Err(Error::FailedPrecondition(format!(
                "Python callback client {client} is already served by another stream"
            )));
        }
        inner.departed.retain(|gone| gone != client);
        inner.next_generation += 1;
        let generation = inner.next_generation;
        let (calls, receiver) = mpsc::unbounded_channel();
        inner.clients.insert(
            client.to_string(),
            Client {
                generation,
                calls,
                pending: HashMap::new(),
            },
        );
        drop(inner);
        self.registered.notify_all();
        tracing::debug!(client, "python callbacks served");
        Ok((
            Registration {
                table: self,
                client: client.to_string(),
                generation,
            },
            receiver,
        ))
    }

    /// Hands a reply to the op waiting for it (a reply nobody waits for, say
    /// of an op whose step was cancelled, is dropped).
    pub fn reply(&self, registration: &Registration<'_>, reply: CallbackReply) {
        tracing::debug!(
            call = reply.call,
            code = reply.code,
            "python callback answered"
        );
        let mut inner = self.lock();
        let Some(client) = inner
            .clients
            .get_mut(&registration.client)
            .filter(|c| c.generation == registration.generation)
        else {
            return;
        };
        let Some(waiter) = client.pending.remove(&reply.call) else {
            return;
        };
        drop(inner);
        let answer = if reply.code != 0 {
            Err(TfError::new(reply.code, reply.message))
        } else {
            Ok(reply.outputs)
        };
        let _ = waiter.try_send(answer);
    }

    fn unregister(&self, registration: &Registration<'_>) {
        let mut inner = self.lock();
        if inner
            .clients
            .get(&registration.client)
            .is_some_and(|c| c.generation == registration.generation)
        {
            // Dropping the waiters' senders fails their calls (see `call`).
            inner.clients.remove(&registration.client);
            if inner.departed.len() == DEPARTED_KEPT {
                inner.departed.pop_front();
            }
            inner.departed.push_back(registration.client.clone());
            tracing::debug!(client = %registration.client, "python callbacks no longer served");
        }
    }

    /// Runs the Python of the op with `token` in the script that serves it,
    /// blocking until it answers. Called on TensorFlow's threads, never on the
    /// async runtime.
    pub fn call(&self, token: &str, op: &str, node: &str, inputs: Vec<TensorProto>) -> Reply {
        let Some(client) = client_of(token) else {
            return Err(TfError::new(
                FAILED_PRECONDITION,
                format!(
                    "op {op} ({node}) calls back into the Python of the script that built it, and that \
                     script's process does not serve it: run the script with the salus adapter \
                     (pip install salus-tf, SALUS_SERVER set), which runs such Python in the script's \
                     process"
                ),
            ));
        };
        let deadline = Instant::now() + REGISTRATION_GRACE;
        let mut inner = self.lock();
        while !inner.clients.contains_key(client) {
            let now = Instant::now();
            if inner.departed.iter().any(|gone| gone == client) {
                return Err(TfError::new(
                    ABORTED,
                    format!(
                        "op {op} ({node}) calls back into the Python of the script that built it, and \
                         that script's process has disconnected"
                    ),
                ));
            }
            if now >= deadline {
                return Err(TfError::new(
                    ABORTED,
                    format!(
                        "op {op} ({node}) calls back into the Python of the script that built it, and \
                         that script's process is not connected to serve it (it exited, or could not \
                         open its callback stream to this server)"
                    ),
                ));
            }
            inner = self
                .registered
                .wait_timeout(inner, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        inner.next_call += 1;
        let call = inner.next_call;
        let (answer, waiting) = std::sync::mpsc::sync_channel(1);
        let entry = inner.clients.get_mut(client).expect("checked above");
        entry.pending.insert(call, answer);
        let sent = entry.calls.send(CallbackCall {
            call,
            token: token.to_string(),
            inputs,
            op: op.to_string(),
            node: node.to_string(),
        });
        if sent.is_err() {
            entry.pending.remove(&call);
        }
        tracing::debug!(
            call,
            token,
            op,
            node,
            sent = sent.is_ok(),
            "python callback called"
        );
        drop(inner);
        waiting.recv().unwrap_or_else(|_| {
            Err(TfError::new(
                ABORTED,
                format!(
                    "op {op} ({node}): the script's process that runs its Python disconnected before \
                     answering"
                ),
            ))
        })
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.table.unregister(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn tokens_name_their_client() {
        assert_eq!(
            client_of(&format!("pyfunc_3{TOKEN_MARK}{CLIENT}")),
            Some(CLIENT)
        );
        assert_eq!(client_of("pyfunc_3"), None);
        assert_eq!(client_of(&format!("pyfunc_3{TOKEN_MARK}short")), None);
        assert_eq!(client_of(&format!("pyfunc_3{TOKEN_MARK}{CLIENT}/..")), None);
    }

    #[test]
    fn a_call_reaches_its_client_and_gets_the_reply() {
        let calls = PythonCalls::default();
        let client = "a_call_reaches_its_client_0001";
        let (registration, mut receiver) = calls.register(client).unwrap();
        assert!(calls.register(client).is_err(), "one stream per client");
        std::thread::scope(|s| {
            let caller = s.spawn(|| {
                calls.call(
                    &format!("pyfunc_0{TOKEN_MARK}{client}"),
                    "PyFunc",
                    "f",
                    vec![],
                )
            });
            let call = receiver.blocking_recv().unwrap();
            assert_eq!(call.op, "PyFunc");
            calls.reply(
                &registration,
                CallbackReply {
                    call: call.call,
                    code: 3,
                    message: "ValueError: no".into(),
                    ..Default::default()
                },
            );
            let answer = caller.join().unwrap();
            assert_eq!(answer.unwrap_err(), TfError::new(3, "ValueError: no"));
        });
    }

    #[test]
    fn a_disconnect_fails_the_waiting_calls() {
        let calls = python_calls();
        let client = "a_disconnect_fails_waiting_0002";
        let (registration, mut receiver) = calls.register(client).unwrap();
        std::thread::scope(|s| {
            let caller = s.spawn(|| {
                calls.call(
                    &format!("pyfunc_0{TOKEN_MARK}{client}"),
                    "EagerPyFunc",
                    "g",
                    vec![],
                )
            });
            receiver.blocking_recv().unwrap();
            drop(registration);
            let err = caller.join().unwrap().unwrap_err();
            assert_eq!(err.code, ABORTED);
            assert!(err.message.contains("disconnected"), "{err}");
        });
        // A later op of the departed client fails at once, saying so (no grace wait).
        let err = calls
            .call(
                &format!("pyfunc_1{TOKEN_MARK}{client}"),
                "PyFunc",
                "h",
                vec![],
            )
            .unwrap_err();
        assert_eq!(err.code, ABORTED);
        assert!(err.message.ends_with("has disconnected"), "{err}");
        // The id can be served again by a new stream.
        assert!(calls.register(client).is_ok());
    }

    #[test]
    fn an_unmarked_token_says_what_to_do() {
        let err = PythonCalls::default()
            .call("pyfunc_1", "PyFunc", "n", vec![])
            .unwrap_err();
        assert_eq!(err.code, FAILED_PRECONDITION);
        assert!(err.message.contains("salus adapter"), "{err}");
    }
}
