//! Executor threads: run main iterations in the order the scheduler core picks.
//!
//! Each lane has `lane_concurrency` dedicated threads. A request handler submits
//! its iteration (a closure that runs TensorFlow and sends the reply) and awaits
//! the reply; the lane's threads ask the core for the next iteration whenever a
//! slot frees, so a switch between jobs costs one decision on a thread that is
//! already awake. Queued iterations whose client has gone (reply receiver
//! dropped) or whose deadline passed are dropped without running.
//!
//! The state is behind a `std::sync::Mutex`: it is never held across an
//! `.await` or a TensorFlow call, only for a decision or a bookkeeping update.

mod identity;
mod lane;
mod stats;
mod tenants;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::runtime::job_history::{HistorySaver, JobIdentities};
use crate::runtime::latency::LatencyRecorder;
use crate::runtime::run_class::RunClass;
use crate::runtime::run_stats::RunStats;
use crate::runtime::saved_hints::{hints_key, SavedHints};
use crate::runtime::tenant_ids::TenantIds;
use crate::runtime::timeline::Timeline;
use crate::sched::policy::{self, Policy};
use crate::sched::{
    Hints, JobId, LaneId, Nanos, RunEnd, SchedConfig, SchedError, Scheduler, SortKey,
};

pub use lane::{LocalTurn, LocalWant, MainTurn, RemoteIteration, Work};
pub use stats::ExecStats;
use tenants::apply_weights;
pub use tenants::TenantFigures;

struct Inner {
    sched: Scheduler<Work>,
    tenants: TenantIds,
    lanes_with_threads: HashSet<LaneId>,
    switch_latency: LatencyRecorder,
    handover_latency: LatencyRecorder,
    iterations_total: u64,
    /// (second since epoch, iterations finished in it)
    rate: VecDeque<(u64, u64)>,
    cheap_runs_total: u64,
    dropped: u64,
    lane_holds_released: u64,
    run_stats: RunStats,
    running: Vec<(LaneId, usize)>,
    stopping: bool,
    /// Who the open jobs are, for the job history.
    identities: JobIdentities,
    /// Where the history goes after each run it records (None: not kept).
    history_saver: Option<HistorySaver>,
    /// Set while the node is drained (`salus drain`): why no new job opens.
    drain: Option<String>,
    /// Hints an admin set at run time, by job identity
    /// ([`crate::settings::hints_key`]): a job of that tenant and name gets
    /// them when it joins the scheduler (re-submitted, or adopted after a
    /// restart), over the hints its client gave.
    saved_hints: HashMap<String, SavedHints>,
    /// Jobs reopened (adopted after a restart) that have not joined the
    /// scheduler yet: they join as having run before.
    reopened: HashSet<JobId>,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Condvar,
    epoch: Instant,
    lane_concurrency: usize,
    /// Recent runs, under a lock of its own so that readers never hold `inner`.
    timeline: Arc<Timeline>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }
}

/// Cheap handle to the scheduler core of the process that schedules (the
/// `--isolation none` server, or the supervisor), with its lane threads. Jobs
/// reach it through a [`crate::runtime::sched_port::SchedPort`]: this in the
/// same process, the seam in a tenant's executor process.
#[derive(Clone)]
pub struct Executor {
    shared: Arc<Shared>,
}

impl Executor {
    pub fn new(policy: Box<dyn Policy>, config: SchedConfig) -> Executor {
        Executor::with_timeline(policy, config, Arc::new(Timeline::default()))
    }

    /// An executor that records its runs in `timeline`.
    pub fn with_timeline(
        policy: Box<dyn Policy>,
        config: SchedConfig,
        timeline: Arc<Timeline>,
    ) -> Executor {
        Executor {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    sched: Scheduler::new(policy, config),
                    tenants: TenantIds::default(),
                    lanes_with_threads: HashSet::new(),
                    switch_latency: LatencyRecorder::default(),
                    handover_latency: LatencyRecorder::default(),
                    iterations_total: 0,
                    rate: VecDeque::new(),
                    cheap_runs_total: 0,
                    dropped: 0,
                    lane_holds_released: 0,
                    run_stats: RunStats::default(),
                    running: Vec::new(),
                    stopping: false,
                    identities: JobIdentities::default(),
                    history_saver: None,
                    drain: None,
                    saved_hints: HashMap::new(),
                    reopened: HashSet::new(),
                }),
                wake: Condvar::new(),
                epoch: Instant::now(),
                lane_concurrency: config.lane_concurrency.max(1),
                timeline,
            }),
        }
    }

    pub fn add_job(&self, id: JobId, lane: LaneId, hints: Hints) -> Result<()> {
        let now = self.shared.now();
        let mut inner = self.shared.lock();
        // The owner was recorded when the job opened (`open_job`).
        let tenant = inner.tenants.owner(id);
        let identity = inner.identities.get(id).cloned();
        let hints = match identity
            .as_ref()
            .and_then(|who| inner.saved_hints.get(&hints_key(&who.tenant, &who.name)))
        {
            Some(saved) => saved.over(hints),
            None => hints,
        };
        let hints = inner.tenants.clamp(id, hints);
        let added = match identity {
            Some(identity) => inner
                .sched
                .add_identified_job(id, lane, tenant, identity, hints, now),
            None => inner.sched.add_tenant_job(id, lane, tenant, hints, now),
        };
        added.map_err(sched_error)?;
        if inner.reopened.remove(&id) {
            let _ = inner.sched.joined_midway(id);
        }
        self.start_lane_threads(&mut inner, lane)
    }

    /// Moves a job to another lane (a lane merge); the lane runs nothing new
    /// until the job's iteration in flight, if any, ends. An unknown job (it
    /// left meanwhile) is ignored.
    pub fn move_job(&self, id: JobId, lane: LaneId) -> Result<()> {
        {
            let mut inner = self.shared.lock();
            if inner.sched.move_job(id, lane).is_err() {
                return Ok(());
            }
            self.start_lane_threads(&mut inner, lane)?;
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Lanes running or about to run iterations (memory admission merges only idle ones).
    pub fn busy_lanes(&self) -> Vec<LaneId> {
        let now = self.shared.now();
        self.shared.lock().sched.busy_lanes(now)
    }

    /// Forgets a job that did not run to its end (it could not open, or is
    /// cancelled); [`Self::end_job`].
    pub fn remove_job(&self, id: JobId) {
        self.end_job(id, RunEnd::Cancelled);
    }

    /// Forgets a job that ended as `end`; its queued iterations are dropped
    /// (their clients get an error). A job known by its identity that ran a
    /// main iteration adds its run to the job history (saved to the state
    /// directory). A job already forgotten is ignored.
    pub fn end_job(&self, id: JobId, end: RunEnd) {
        let dropped = {
            let mut inner = self.shared.lock();
            let recorded = inner
                .sched
                .status(id)
                .is_some_and(|s| s.identity.is_some() && s.iterations > 0);
            let dropped = inner.sched.end_job(id, end).unwrap_or_default();
            if recorded {
                if let Some(saver) = &inner.history_saver {
                    saver.save(inner.sched.history());
                }
            }
            inner.identities.forget(id);
            inner.reopened.remove(&id);
            inner.tenants.forget_job(id);
            inner.dropped += dropped.len() as u64;
            inner.run_stats.forget(id);
            dropped
        };
        self.shared.timeline.close_job(id);
        self.shared.wake.notify_all();
        drop(dropped);
    }

    /// Whether a run goes at once (`Cheap`) or through the scheduler (`Main`):
    /// a [`RunClass::Brief`] run queues when another job's queued iteration
    /// ranks ahead of `job`.
    pub fn resolve(&self, job: JobId, class: RunClass) -> RunClass {
        match class {
            RunClass::Brief if self.shared.lock().sched.outranked(job) => RunClass::Main,
            RunClass::Brief => RunClass::Cheap,
            other => other,
        }
    }

    /// Drains the node (`Some(why)`: no new job opens, each is refused with
    /// UNAVAILABLE saying `why`; open jobs run on) or admits jobs again (None).
    pub fn set_drain(&self, why: Option<String>) {
        self.shared.lock().drain = why;
    }

    /// Why the node is drained, if it is.
    pub fn drain(&self) -> Option<String> {
        self.shared.lock().drain.clone()
    }

    pub fn set_policy(&self, name: &str) -> Result<(&'static str, &'static str)> {
        let policy = policy::by_name(name).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let new = policy.name();
        let previous = {
            let mut inner = self.shared.lock();
            let previous = inner.sched.policy_name();
            inner.sched.set_policy(policy);
            previous
        };
        self.shared.wake.notify_all();
        Ok((previous, new))
    }

    pub fn policy_name(&self) -> &'static str {
        self.shared.lock().sched.policy_name()
    }

    pub fn set_hints(&self, id: JobId, hints: Hints) -> Result<()> {
        {
            let mut inner = self.shared.lock();
            let hints = inner.tenants.clamp(id, hints);
            inner.sched.set_hints(id, hints).map_err(sched_error)?;
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// The rank a job arriving now with `hints` has under the current policy
    /// (memory admission re-checks waiting jobs in this order). The hints are
    /// capped by the job's owner's limits here, whoever passed them: over the
    /// seam they are what a tenant's executor says.
    pub fn rank_new(&self, id: JobId, hints: &Hints) -> SortKey {
        let inner = self.shared.lock();
        let now = self.shared.now();
        let identity = inner.identities.get(id);
        let hints = inner.tenants.capped(id, hints.clone());
        inner.sched.rank_new_as(id, identity, &hints, now)
    }

    /// Refuses new iterations and stops the executor threads once idle.
    pub fn stop(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
    }
}

fn sched_error(err: SchedError) -> Error {
    match err {
        SchedError::BadWeight(_) => Error::InvalidArgument(err.to_string()),
        _ => Error::Internal(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::timeline::JobKind;
    use crate::tenant::identity::Tenant;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A main iteration through this core's port, as the front ends run one.
    async fn run_main<T, F>(
        core: &Executor,
        job: JobId,
        deadline: Option<Instant>,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        crate::runtime::sched_port::SchedPort::Local(core.clone())
            .run_main(job, deadline, f)
            .await
    }
    use crate::sched::policy::by_name;

    fn executor(policy: &str) -> Executor {
        Executor::new(
            by_name(policy).unwrap(),
            SchedConfig {
                lane_concurrency: 1,
                anticipation: 0,
                ..SchedConfig::default()
            },
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_iterations_and_reports_results_and_stats() {
        let ex = executor("pack");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        let v = run_main(&ex, JobId(1), None, || Ok(41 + 1)).await.unwrap();
        assert_eq!(v, 42);
        let err = run_main::<(), _>(&ex, JobId(1), None, || {
            Err(Error::InvalidArgument("bad".into()))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let panicked = run_main::<(), _>(&ex, JobId(1), None, || panic!("boom"))
            .await
            .unwrap_err();
        assert!(matches!(panicked, Error::Internal(_)));
        let status = ex.job_status(JobId(1)).unwrap();
        assert_eq!(status.iterations, 3);
        assert_eq!(ex.stats().iterations_total, 3);
        let unknown = run_main(&ex, JobId(9), None, || Ok(())).await.unwrap_err();
        assert!(matches!(unknown, Error::IterationDropped(_)));
    }

    /// A drained core refuses a job opening with UNAVAILABLE naming the
    /// drain, while a job open before runs on; undrained, jobs open again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drained_core_refuses_new_jobs_and_runs_open_ones() {
        let ex = executor("fair");
        let alice = Tenant::named("alice");
        ex.open_job(JobId(1), "before", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.set_drain(Some(
            "this node is draining for maintenance (salus drain)".into(),
        ));
        let refused = ex
            .open_job(JobId(2), "after", JobKind::Graph, Some(&alice))
            .unwrap_err();
        assert!(matches!(refused, Error::Unavailable(_)), "{refused:?}");
        assert_eq!(
            refused.code(),
            salus_proto::tensorflow::error::Code::Unavailable
        );
        assert!(refused.to_string().contains("salus drain"), "{refused}");
        // The refused job was never counted as its tenant's.
        assert_eq!(ex.jobs_opened(ex.tenant_id(&alice)), 1);
        assert_eq!(run_main(&ex, JobId(1), None, || Ok(7)).await.unwrap(), 7);
        // A job that was open before a restart (adopted) is no new job.
        ex.reopen_job(JobId(3), "adopted", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.set_drain(None);
        ex.open_job(JobId(2), "after", JobKind::Graph, Some(&alice))
            .unwrap();
    }

    /// Hints saved for a job identity apply to a job of that tenant and
    /// name when it joins (adopted or submitted again), over its client's.
    #[test]
    fn saved_hints_apply_to_a_job_of_that_identity() {
        let ex = executor("priority");
        let alice = Tenant::named("alice");
        // Kept by the tenant's key: the token tenant alice's, not user alice's.
        ex.save_hints(
            hints_key("name:alice", "resnet"),
            Some(SavedHints {
                priority: 5,
                expected_iterations: Some(100),
                expected_seconds: None,
                set_unix_s: 1,
            }),
        );
        ex.open_job(JobId(1), "resnet", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(
            JobId(1),
            LaneId(0),
            Hints {
                name: "resnet".into(),
                priority: 1,
                ..Hints::default()
            },
        )
        .unwrap();
        let hints = ex.job_status(JobId(1)).unwrap().hints;
        assert_eq!((hints.priority, hints.expected_iterations), (5, Some(100)));
        ex.open_job(JobId(2), "other", JobKind::Graph, Some(&alice))
            .unwrap();
        ex.add_job(
            JobId(2),
            LaneId(0),
            Hints {
                name: "other".into(),
                priority: 1,
                ..Hints::default()
            },
        )
        .unwrap();
        assert_eq!(ex.job_status(JobId(2)).unwrap().hints.priority, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_and_removed_iterations_are_dropped_not_run() {
        let ex = executor("fifo");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        run_main(&ex, JobId(1), None, || Ok(())).await.unwrap();
        // FIFO: job 2 waits behind job 1 (alive, started, idle) forever...
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let past = Instant::now();
        let expired = run_main(&ex, JobId(2), Some(past), move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert!(matches!(expired.await, Err(Error::IterationDropped(_))));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        // ...until job 1 is removed; a job's own queue is dropped when it is removed.
        let ex2 = ex.clone();
        let waiting = tokio::spawn(async move { run_main(&ex2, JobId(2), None, || Ok(7)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        ex.remove_job(JobId(1));
        assert_eq!(waiting.await.unwrap().unwrap(), 7);
        assert!(ex.stats().dropped_iterations >= 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_iteration_whose_caller_left_before_its_turn_is_dropped_unrun() {
        let ex = executor("fifo");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        run_main(&ex, JobId(1), None, || Ok(())).await.unwrap();
        // FIFO: job 2 waits behind job 1 until job 1 leaves.
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let ex2 = ex.clone();
        let waiting = tokio::spawn(async move {
            run_main(&ex2, JobId(2), None, move || {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiting.abort(); // its client left
        let _ = waiting.await;
        let dropped_before = ex.stats().dropped_iterations;
        ex.remove_job(JobId(1));
        // Job 2 can run now; its given-up iteration is dropped, and a new one runs.
        assert_eq!(run_main(&ex, JobId(2), None, || Ok(3)).await.unwrap(), 3);
        assert!(!ran.load(Ordering::SeqCst));
        assert_eq!(ex.stats().dropped_iterations, dropped_before + 1);
        assert_eq!(ex.job_status(JobId(2)).unwrap().iterations, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn main_iterations_and_cheap_runs_go_on_the_timeline() {
        use crate::runtime::timeline::JobKind;
        let ex = executor("rr");
        ex.timeline().open_job(JobId(1), "a", JobKind::Graph, None);
        ex.add_job(JobId(1), LaneId(3), Hints::default()).unwrap();
        let before = Instant::now();
        run_main(&ex, JobId(1), None, || {
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        })
        .await
        .unwrap();
        let t = Instant::now();
        ex.record_cheap_run(JobId(1), t, t);
        // A job the scheduler does not know yet (waiting for memory): no lane.
        ex.record_cheap_run(JobId(2), t, t);
        let snap = ex.timeline().snapshot(None);
        assert_eq!(snap.spans.len(), 3);
        let main = &snap.spans[0];
        assert_eq!(
            (main.job, main.lane, main.class),
            (JobId(1), Some(LaneId(3)), RunClass::Main)
        );
        assert!(
            main.start >= before && main.end.duration_since(main.start) >= Duration::from_millis(2)
        );
        assert_eq!(main.label.as_ref().unwrap().name, "a");
        assert_eq!(
            (snap.spans[1].lane, snap.spans[1].class),
            (Some(LaneId(3)), RunClass::Cheap)
        );
        assert_eq!(snap.spans[2].lane, None);
        assert_eq!(ex.stats().cheap_runs_total, 2);
        // A run that ends just after its job was removed still names it.
        ex.remove_job(JobId(1));
        ex.record_cheap_run(JobId(1), t, t);
        let snap = ex.timeline().snapshot(None);
        assert_eq!(snap.spans[3].label.as_ref().unwrap().name, "a");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn switching_between_jobs_is_measured_and_policy_changes_apply() {
        let ex = executor("rr");
        ex.add_job(JobId(1), LaneId(0), Hints::default()).unwrap();
        ex.add_job(JobId(2), LaneId(0), Hints::default()).unwrap();
        let mut handles = Vec::new();
        for job in [1, 2] {
            let ex = ex.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..20 {
                    run_main(&ex, JobId(job), None, || {
                        std::thread::sleep(Duration::from_micros(200));
                        Ok(())
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let stats = ex.stats();
        assert_eq!(stats.iterations_total, 40);
        assert_eq!(stats.runs.iteration_time.count, 40);
        assert!(
            stats.runs.iteration_time.sum_us >= 40.0 * 200.0,
            "{stats:?}"
        );
        assert_eq!(stats.runs.queue_wait.count, 40);
        // Each go-ahead's wake of the thread that ran the iteration.
        assert_eq!(stats.handover_latency.count, 40);
        assert!(stats.switch_latency.count > 0, "{stats:?}");
        assert_eq!(ex.set_policy("srtf").unwrap(), ("rr", "srtf"));
        // Lane threads end with their lane and come back with a new job.
        ex.remove_job(JobId(1));
        ex.remove_job(JobId(2));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ex.shared.lock().lanes_with_threads.is_empty());
        ex.add_job(JobId(3), LaneId(0), Hints::default()).unwrap();
        assert_eq!(run_main(&ex, JobId(3), None, || Ok(5)).await.unwrap(), 5);
        assert!(ex.set_policy("bogus").is_err());
        assert_eq!(ex.policy_name(), "srtf");
    }
}
