//! The tensors an eager job's `_Send` ops hand to `RecvTensor` pulls, by tensor
//! name. A pull may arrive before its send has run (or even before the request
//! carrying the send has arrived): it waits. Sends are announced when their
//! request is queued, so a pull for an announced name waits as long as it takes,
//! while a pull for a name nobody announced fails after a grace period.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use salus_proto::tensorflow::TensorProto;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::tf::TfError;

/// How long a pull waits for a send that no queued request announced: the
/// client sends the `_Send` op and the pull on two gRPC calls at once.
pub const UNANNOUNCED_GRACE: Duration = Duration::from_secs(10);

/// Sends one context may have announced or delivered and not yet pulled: a
/// client that sends values and never pulls them cannot grow the server
/// beyond this (its next request with a `_Send` is refused).
pub const MAX_UNPULLED: usize = 16_384;

/// A sent tensor, or why its send failed (with the failure's code: the client
/// raises the pull's error as the op's own, as with a failed send in TensorFlow).
type Value = std::result::Result<Sent, TfError>;

/// A sent tensor and when it was sent (µs since the epoch, for the response).
#[derive(Clone, Debug)]
pub struct Sent {
    pub tensor: TensorProto,
    pub sent_micros: i64,
}

#[derive(Default)]
struct Slot {
    announced: u32,
    values: Vec<Value>,
    waiters: Vec<oneshot::Sender<Value>>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<String, Slot>,
    closed: Option<String>,
}

#[derive(Default)]
pub struct Rendezvous {
    inner: Mutex<Inner>,
}

impl Rendezvous {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A send for `name` is queued and will run (or fail) later.
    #[cfg(test)]
    pub fn announce(&self, name: &str) {
        self.announce_all(&[name.to_string()], usize::MAX)
            .expect("no bound");
    }

    /// The sends of one request, each queued to run (or fail) later; refused,
    /// all of them, when the context would then hold more than `max` sends
    /// not yet pulled ([`MAX_UNPULLED`]).
    pub fn announce_all(&self, names: &[String], max: usize) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        let held: usize = inner
            .slots
            .values()
            .map(|s| s.announced as usize + s.values.len())
            .sum();
        if held.saturating_add(names.len()) > max {
            return Err(Error::ResourceExhausted(format!(
                "this eager context holds {held} sent values that no RecvTensor pulled yet (at most {max}): \
                 pull them (or stop sending values the script never reads) before sending more"
            )));
        }
        for name in names {
            let slot = inner.slots.entry(name.clone()).or_default();
            slot.announced = slot.announced.saturating_add(1);
        }
        Ok(())
    }

    /// Delivers a sent tensor (or the error of a send that failed) to the
    /// oldest waiting pull, else keeps it for the next pull.
    pub fn deliver(&self, name: &str, mut value: Value) {
        let mut inner = self.lock();
        let slot = inner.slots.entry(name.to_string()).or_default();
        slot.announced = slot.announced.saturating_sub(1);
        while !slot.waiters.is_empty() {
            match slot.waiters.remove(0).send(value) {
                Ok(()) => {
                    if slot.values.is_empty() && slot.waiters.is_empty() && slot.announced == 0 {
                        inner.slots.remove(name);
                    }
                    return;
                }
                // That pull gave up (its client cancelled): try the next one.
                Err(back) => value = back,
            }
        }
        slot.values.push(value);
    }

    /// Waits for the tensor sent as `name`; gives up after `grace` if no send
    /// for it was announced by then.
    pub async fn recv(&self, name: &str, grace: Duration) -> Result<Sent> {
        let rx = {
            let mut inner = self.lock();
            if let Some(reason) = &inner.closed {
                return Err(Error::ContextGone(reason.clone()));
            }
            let slot = inner.slots.entry(name.to_string()).or_default();
            if !slot.values.is_empty() {
                let value = slot.values.remove(0);
                if slot.values.is_empty() && slot.waiters.is_empty() && slot.announced == 0 {
                    inner.slots.remove(name);
                }
                return value.map_err(Error::Tensorflow);
            }
            let (tx, rx) = oneshot::channel();
            slot.waiters.push(tx);
            rx
        };
        tokio::pin!(rx);
        let wait = tokio::time::sleep(grace);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                value = &mut rx => {
                    return match value {
                        Ok(value) => value.map_err(Error::Tensorflow),
                        Err(_) => Err(Error::ContextGone(self.closed_reason())),
                    };
                }
                () = &mut wait, if !wait.is_elapsed() => {
                    if !self.is_announced(name) {
                        self.drop_waiters(name);
                        return Err(Error::InvalidArgument(format!(
                            "RecvTensor: no _Send op for tensor {name:?} was enqueued in this context within {:.1} s",
                            grace.as_secs_f64()
                        )));
                    }
                }
            }
        }
    }

    fn is_announced(&self, name: &str) -> bool {
        self.lock().slots.get(name).is_some_and(|s| s.announced > 0)
    }

    fn drop_waiters(&self, name: &str) {
        let mut inner = self.lock();
        if let Some(slot) = inner.slots.get_mut(name) {
            slot.waiters.retain(|w| !w.is_closed());
            slot.waiters.clear();
            if slot.values.is_empty() && slot.announced == 0 {
                inner.slots.remove(name);
            }
        }
    }

    fn closed_reason(&self) -> String {
        self.lock()
            .closed
            .clone()
            .unwrap_or_else(|| "the eager context was closed".into())
    }

    /// Fails every waiting and later pull: the context is gone.
    pub fn close(&self, reason: &str) {
        let mut inner = self.lock();
        inner.closed = Some(reason.to_string());
        // Dropping the senders wakes the waiting pulls with the close reason.
        inner.slots.clear();
    }

    /// Tensors sent but not pulled yet.
    pub fn pending(&self) -> usize {
        self.lock().slots.values().map(|s| s.values.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(v: f32) -> Sent {
        Sent {
            tensor: TensorProto {
                float_val: vec![v],
                ..Default::default()
            },
            sent_micros: 1,
        }
    }

    #[tokio::test]
    async fn a_pull_before_its_send_waits_for_it() {
        let r = std::sync::Arc::new(Rendezvous::default());
        r.announce("t1");
        let pull = tokio::spawn({
            let r = r.clone();
            async move { r.recv("t1", UNANNOUNCED_GRACE).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.deliver("t1", Ok(sent(3.0)));
        assert_eq!(pull.await.unwrap().unwrap().tensor.float_val, vec![3.0]);
        assert_eq!(r.pending(), 0);
    }

    #[tokio::test]
    async fn a_send_before_its_pull_is_kept_once() {
        let r = Rendezvous::default();
        r.announce("t");
        r.deliver("t", Ok(sent(1.0)));
        assert_eq!(r.pending(), 1);
        assert_eq!(
            r.recv("t", UNANNOUNCED_GRACE)
                .await
                .unwrap()
                .tensor
                .float_val,
            vec![1.0]
        );
        assert_eq!(r.pending(), 0);
    }

    #[tokio::test]
    async fn failed_sends_and_closed_contexts_fail_the_pull() {
        let r = std::sync::Arc::new(Rendezvous::default());
        r.announce("bad");
        r.deliver("bad", Err(TfError::new(3, "input handle 3:0 is unknown")));
        // The send's own code: the client raises it as the op's error.
        assert!(
            matches!(r.recv("bad", UNANNOUNCED_GRACE).await, Err(Error::Tensorflow(e)) if e.code == 3 && e.message.contains("3:0"))
        );
        r.announce("later");
        let pull = tokio::spawn({
            let r = r.clone();
            async move { r.recv("later", UNANNOUNCED_GRACE).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.close("context 7 was reclaimed");
        assert!(matches!(pull.await.unwrap(), Err(Error::ContextGone(_))));
        assert!(
            matches!(r.recv("x", UNANNOUNCED_GRACE).await, Err(Error::ContextGone(m)) if m.contains("reclaimed"))
        );
    }

    #[tokio::test]
    async fn sends_nobody_pulls_are_bounded() {
        let r = Rendezvous::default();
        let names = |from: usize, n: usize| -> Vec<String> {
            (from..from + n).map(|i| format!("t{i}")).collect()
        };
        r.announce_all(&names(0, 3), 4).unwrap();
        for name in names(0, 3) {
            r.deliver(&name, Ok(sent(1.0)));
        }
        r.announce_all(&names(3, 1), 4).unwrap();
        // Three kept and one announced: a fifth is refused, and so is a
        // request that would go past the bound with only part of its sends.
        let err = r.announce_all(&names(4, 1), 4).unwrap_err();
        assert!(matches!(&err, Error::ResourceExhausted(m) if m.contains("at most 4")), "{err:?}");
        assert!(r.announce_all(&names(4, 2), 4).is_err());
        // A pull makes room again.
        r.recv("t0", UNANNOUNCED_GRACE).await.unwrap();
        r.announce_all(&names(4, 1), 4).unwrap();
        assert_eq!(r.pending(), 2, "t1 and t2 kept; t3 and t4 announced");
    }

    #[tokio::test]
    async fn a_pull_nobody_announced_fails_after_the_grace_period() {
        let r = Rendezvous::default();
        let err = r
            .recv("never", Duration::from_millis(30))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(m) if m.contains("never")));
        assert_eq!(r.pending(), 0);
    }
}
