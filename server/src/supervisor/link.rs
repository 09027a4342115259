//! The supervisor's end of one executor's seam: its requests go to the one
//! scheduler core and the one memory admission (the runtime's `Executor` and
//! `Admission`, as in a single-process server), and the answers go back.
//!
//! A reader thread per executor handles its messages in order. A wanted main
//! iteration is queued in the core as a [`RemoteIteration`]: when the core
//! picks it, the lane thread sends Go and waits for Done, so the lane is held
//! for exactly the iteration, in whichever process it runs, or for the lane
//! hold limit at most: an iteration still running then (blocked on a queue
//! nobody fills, say) runs on while the lane starts others, so no tenant's
//! iteration can hold a lane for good. Every message naming a job must name
//! one of the executor's own (its id range, given at its start): an executor
//! runs what its tenant sent, and one subverted by a hostile graph must not
//! reach other tenants' jobs through the seam. When the executor
//! dies, [`Link::die`] forgets its jobs, returns their memory and wakes every
//! lane thread waiting on it.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::sync::lock;
use crate::runtime::admission::{Admission, LaneReservation};
use crate::runtime::executor::{Executor, RemoteIteration};
use crate::runtime::run_class::RunClass;
use crate::runtime::timeline::JobKind;
use crate::sched::lanes::MemoryNeed;
use crate::sched::{JobId, LaneId, RunEnd};
use crate::seam::frame::{read_frame, write_frame};
use crate::seam::hints_from_msg;
use crate::seam::msg::{self, to_executor, to_supervisor};
use crate::tenant::identity::Tenant;


pub struct Link {
    writer: Mutex<UnixStream>,
    executor: Executor,
    admission: Option<Admission>,
    runtime: tokio::runtime::Handle,
    /// Lane threads waiting for an iteration's Done, by turn.
    running: Mutex<HashMap<u64, mpsc::SyncSender<()>>>,
    /// Wanted iterations whose requester left before their go-ahead.
    cancelled: Mutex<HashSet<u64>>,
    /// Iterations an adopted executor was running at its adoption (their
    /// go-ahead came from the old supervisor), and those of them whose Done
    /// came before the core picked them.
    adopted_running: Mutex<HashSet<u64>>,
    done_early: Mutex<HashSet<u64>>,
    /// The executor's jobs the core knows.
    jobs: Mutex<HashSet<JobId>>,
    reservations: Mutex<HashMap<JobId, LaneReservation>>,
    reports: Mutex<HashMap<u64, mpsc::SyncSender<msg::Report>>>,
    next_report: std::sync::atomic::AtomicU64,
    hello: Mutex<Option<oneshot::Sender<msg::Hello>>>,
    /// The executor's tenant: the owner of every job it opens.
    owner: Tenant,
    /// Longest wait for an iteration's Done before its lane moves on.
    hold_limit: Option<Duration>,
    /// The job ids this executor may name (`SALUS_EXECUTOR_JOB_BASE` on).
    job_ids: Range<u64>,
    /// Messages refused for naming a job not the executor's.
    foreign: std::sync::atomic::AtomicU64,
    dead: AtomicBool,
    /// Set when the executor, shutting down, has drained its eager jobs (or died).
    drained: tokio::sync::watch::Sender<bool>,
}

impl Link {
    /// Starts the reader thread; `hello` receives the executor's Hello (it is
    /// serving). The thread ends, and the link dies, when the executor's end closes.
    pub fn start(
        stream: UnixStream,
        executor: Executor,
        admission: Option<Admission>,
        runtime: tokio::runtime::Handle,
        label: String,
        owner: Tenant,
        hold_limit: Option<Duration>,
        job_ids: Range<u64>,
    ) -> std::io::Result<(Arc<Link>, oneshot::Receiver<msg::Hello>)> {
        let reader = stream.try_clone()?;
        let (hello_tx, hello_rx) = oneshot::channel();
        let link = Arc::new(Link {
            writer: Mutex::new(stream),
            executor,
            admission,
            runtime,
            running: Mutex::new(HashMap::new()),
            cancelled: Mutex::new(HashSet::new()),
            adopted_running: Mutex::new(HashSet::new()),
            done_early: Mutex::new(HashSet::new()),
            jobs: Mutex::new(HashSet::new()),
            reservations: Mutex::new(HashMap::new()),
            reports: Mutex::new(HashMap::new()),
            next_report: std::sync::atomic::AtomicU64::new(1),
            hello: Mutex::new(Some(hello_tx)),
            owner,
            hold_limit,
            job_ids,
            foreign: std::sync::atomic::AtomicU64::new(0),
            dead: AtomicBool::new(false),
            drained: tokio::sync::watch::Sender::new(false),
        });
        let reading = link.clone();
        std::thread::Builder::new()
            .name(format!("salus-link-{label}"))
            .spawn(move || {
                let mut reader = reader;
                loop {
                    match read_frame::<_, msg::ToSupervisor>(&mut reader) {
                        Ok(Some(message)) => reading.handle(message),
                        Ok(None) => break,
                        Err(err) => {
                            tracing::error!(executor = %label, cause = %err, "the seam to an executor failed");
                            break;
                        }
                    }
                }
                reading.die();
            })?;
        Ok((link, hello_rx))
    }

    /// Waits until the executor drained its eager jobs for shutdown, or died.
    pub async fn wait_drained(&self) {
        let mut drained = self.drained.subscribe();
        let _ = drained.wait_for(|d| *d).await;
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Open jobs of this executor the scheduler knows.
    pub fn open_jobs(&self) -> usize {
        lock(&self.jobs).len()
    }

    fn send(&self, message: to_executor::Msg) {
        if self.is_dead() {
            return;
        }
        let frame = msg::ToExecutor { msg: Some(message) };
        if write_frame(&mut *lock(&self.writer), &frame).is_err() {
            // The reader sees the end too and cleans up.
            self.dead.store(true, Ordering::SeqCst);
        }
    }

    /// Whether `job` is one of this executor's (in its id range).
    pub fn owns_job(&self, job: u64) -> bool {
        self.job_ids.contains(&job)
    }

    /// Messages refused so far for naming a job not the executor's.
    #[cfg(test)]
    fn foreign_messages(&self) -> u64 {
        self.foreign.load(Ordering::Relaxed)
    }

    /// Answers a message that names a job outside the executor's range as a
    /// refusal (where the executor waits for an answer), and logs the first.
    fn refuse_foreign(&self, message: to_supervisor::Msg, job: u64) {
        if self.foreign.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                tenant = %self.owner,
                job,
                "an executor named a job that is not its own (refused; later ones are counted, not logged)"
            );
        }
        let refusal = || msg::AdmitError {
            code: salus_proto::tensorflow::error::Code::PermissionDenied as i32,
            message: format!("job {job} is not this executor's"),
        };
        match message {
            to_supervisor::Msg::OpenJob(open) => self.send(to_executor::Msg::Opened(msg::Opened {
                id: open.id,
                error: Some(refusal()),
            })),
            to_supervisor::Msg::Admit(admit) => self.send(to_executor::Msg::Admitted(msg::Admitted {
                id: admit.id,
                outcome: Some(msg::admitted::Outcome::Error(refusal())),
            })),
            to_supervisor::Msg::Want(want) => self.send(to_executor::Msg::Dropped(msg::Dropped {
                turn: want.turn,
                reason: refusal().message,
            })),
            to_supervisor::Msg::Query(query) => self.send(to_executor::Msg::Answer(msg::Answer {
                id: query.id,
                ..Default::default()
            })),
            _ => {}
        }
    }

    fn handle(self: &Arc<Self>, message: msg::ToSupervisor) {
        let Some(message) = message.msg else { return };
        if let Some(job) = named_job(&message) {
            if !self.owns_job(job) {
                self.refuse_foreign(message, job);
                return;
            }
        }
        match message {
            to_supervisor::Msg::Hello(hello) => {
                if let Some(tx) = lock(&self.hello).take() {
                    let _ = tx.send(hello);
                }
            }
            to_supervisor::Msg::AddJob(add) => {
                let job = JobId(add.job);
                lock(&self.jobs).insert(job);
                // The lane this supervisor's admission gave the job, if it
                // holds memory, whatever the executor says (after an adoption
                // the lanes are this admission's).
                let lane = lock(&self.reservations)
                    .get(&job)
                    .map_or(LaneId(add.lane), LaneReservation::lane);
                if let Err(err) =
                    self.executor
                        .add_job(job, lane, hints_from_msg(add.hints))
                {
                    tracing::warn!(job = add.job, cause = %err, "an executor's job could not join the scheduler");
                }
            }
            to_supervisor::Msg::OpenJob(open) => {
                let job = JobId(open.job);
                lock(&self.jobs).insert(job);
                let kind = if open.eager {
                    JobKind::Eager
                } else {
                    JobKind::Graph
                };
                // The owner is this link's tenant, whatever the executor says.
                // An adopted executor's job (id 0) is open already: a drain
                // does not refuse it.
                let opened = if open.id == 0 {
                    self.executor.reopen_job(job, &open.name, kind, Some(&self.owner))
                } else {
                    self.executor.open_job(job, &open.name, kind, Some(&self.owner))
                };
                let error = opened
                    .err()
                    .map(|err| {
                        lock(&self.jobs).remove(&job);
                        msg::AdmitError {
                            code: err.code() as i32,
                            message: err.to_string(),
                        }
                    });
                if open.id == 0 {
                    // An adopted executor's job, open already: no one waits.
                    if let Some(err) = error {
                        tracing::warn!(tenant = %self.owner, job = open.job, "an adopted job was refused: {}", err.message);
                    }
                } else {
                    self.send(to_executor::Msg::Opened(msg::Opened { id: open.id, error }));
                }
            }
            to_supervisor::Msg::RemoveJob(remove) => {
                let end = RunEnd::from_name(&remove.end).unwrap_or(RunEnd::Cancelled);
                self.forget(JobId(remove.job), end)
            }
            to_supervisor::Msg::SetFingerprint(set) => {
                self.executor.set_fingerprint(JobId(set.job), &set.fingerprint)
            }
            to_supervisor::Msg::Want(want) => {
                let deadline = (want.deadline_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(want.deadline_ms));
                if want.running {
                    lock(&self.adopted_running).insert(want.turn);
                }
                let iteration = Box::new(Turn {
                    link: self.clone(),
                    turn: want.turn,
                    job: JobId(want.job),
                    ran: false,
                    running_already: want.running,
                });
                // On refusal the iteration is dropped, which tells the executor.
                let _ = self
                    .executor
                    .submit_remote(JobId(want.job), deadline, iteration);
            }
            to_supervisor::Msg::Done(done) => {
                if done.go_delay_ns > 0 {
                    self.executor.record_handover(done.go_delay_ns);
                }
                let mut running = lock(&self.running);
                if let Some(tx) = running.remove(&done.turn) {
                    let _ = tx.send(());
                } else if lock(&self.adopted_running).remove(&done.turn) {
                    // Ended before the core picked it: its lane need not wait.
                    lock(&self.done_early).insert(done.turn);
                }
            }
            to_supervisor::Msg::CheapRun(run) => {
                let now = Instant::now();
                let ago = |ns: u64| now.checked_sub(Duration::from_nanos(ns)).unwrap_or(now);
                self.executor.record_cheap_run(
                    JobId(run.job),
                    ago(run.started_ago_ns),
                    ago(run.ended_ago_ns),
                );
            }
            to_supervisor::Msg::Query(query) => {
                let answer = match query.what {
                    Some(msg::query::What::Outranked(job)) => msg::Answer {
                        id: query.id,
                        yes: self.executor.resolve(JobId(job), RunClass::Brief) == RunClass::Main,
                        lane: None,
                    },
                    Some(msg::query::What::LaneForNewGraph(_)) => msg::Answer {
                        id: query.id,
                        yes: false,
                        lane: self
                            .admission
                            .as_ref()
                            .and_then(Admission::lane_for_new_graph)
                            .map(|l| l.0),
                    },
                    None => msg::Answer {
                        id: query.id,
                        ..Default::default()
                    },
                };
                self.send(to_executor::Msg::Answer(answer));
            }
            to_supervisor::Msg::Admit(admit) if admit.held => self.restore_admission(admit),
            to_supervisor::Msg::Admit(admit) => self.admit(admit),
            to_supervisor::Msg::Withdraw(withdraw) => {
                if let Some(admission) = &self.admission {
                    admission.withdraw(JobId(withdraw.job));
                }
            }
            to_supervisor::Msg::Release(release) => {
                lock(&self.reservations).remove(&JobId(release.job));
            }
            to_supervisor::Msg::SetHints(set) => {
                let _ = self
                    .executor
                    .set_hints(JobId(set.job), hints_from_msg(set.hints));
            }
            to_supervisor::Msg::Cancel(cancel) => {
                lock(&self.cancelled).insert(cancel.turn);
            }
            to_supervisor::Msg::Replayed(_) => {
                tracing::info!(tenant = %self.owner, jobs = self.open_jobs(), "an adopted executor's jobs are scheduled here now");
            }
            to_supervisor::Msg::Drained(_) => {
                self.drained.send_replace(true);
            }
            to_supervisor::Msg::Report(report) => {
                if let Some(tx) = lock(&self.reports).remove(&report.id) {
                    let _ = tx.send(report);
                }
            }
        }
    }

    fn admit(self: &Arc<Self>, admit: msg::Admit) {
        let link = self.clone();
        let Some(admission) = self.admission.clone() else {
            self.send(to_executor::Msg::Admitted(msg::Admitted {
                id: admit.id,
                outcome: Some(msg::admitted::Outcome::Error(msg::AdmitError {
                    code: salus_proto::tensorflow::error::Code::FailedPrecondition as i32,
                    message: "this server has no memory capacity (--memory-capacity)".into(),
                })),
            }));
            return;
        };
        self.runtime.spawn(async move {
            let job = JobId(admit.job);
            let need = MemoryNeed {
                persistent: admit.persistent,
                ephemeral: admit.ephemeral,
            };
            let outcome = admission
                .admit(job, need, admit.pinned_lane.map(LaneId), hints_from_msg(admit.hints))
                .await;
            let outcome = match outcome {
                Ok(reservation) => {
                    let lane = reservation.lane();
                    if link.is_dead() {
                        return; // dropping the reservation returns the memory
                    }
                    lock(&link.reservations).insert(job, reservation);
                    msg::admitted::Outcome::Lane(lane.0)
                }
                Err(err) => msg::admitted::Outcome::Error(msg::AdmitError {
                    code: err.code() as i32,
                    message: err.to_string(),
                }),
            };
            link.send(to_executor::Msg::Admitted(msg::Admitted {
                id: admit.id,
                outcome: Some(outcome),
            }));
        });
    }

    /// An adopted executor's job holds memory the old supervisor admitted:
    /// this admission takes it back at once (on its lane where lanes are
    /// fixed), before any new job is served, so it fits as it did.
    fn restore_admission(&self, admit: msg::Admit) {
        let Some(admission) = self.admission.clone() else {
            return;
        };
        let job = JobId(admit.job);
        let need = MemoryNeed {
            persistent: admit.persistent,
            ephemeral: admit.ephemeral,
        };
        let restored = self.runtime.block_on(tokio::time::timeout(
            RESTORE_TIMEOUT,
            admission.admit(job, need, admit.pinned_lane.map(LaneId), hints_from_msg(admit.hints)),
        ));
        match restored {
            Ok(Ok(reservation)) => {
                lock(&self.reservations).insert(job, reservation);
            }
            Ok(Err(err)) => {
                tracing::warn!(tenant = %self.owner, job = admit.job, cause = %err, "an adopted job's memory could not be restored")
            }
            Err(_) => {
                admission.withdraw(job);
                tracing::warn!(tenant = %self.owner, job = admit.job, "an adopted job's memory could not be restored in time (the device is fuller than before the restart)")
            }
        }
    }

    /// A job left: out of the scheduler, its waiting admission withdrawn, its memory back.
    fn forget(&self, job: JobId, end: RunEnd) {
        lock(&self.jobs).remove(&job);
        self.executor.end_job(job, end);
        if let Some(admission) = &self.admission {
            admission.withdraw(job);
        }
        lock(&self.reservations).remove(&job);
    }

    /// The executor is gone: all its jobs leave, lane threads waiting on it wake.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.drained.send_replace(true);
        let jobs: Vec<JobId> = lock(&self.jobs).iter().copied().collect();
        for job in jobs {
            self.forget(job, RunEnd::Failed);
        }
        lock(&self.running).clear();
        lock(&self.reports).clear();
        lock(&self.reservations).clear();
        lock(&self.hello).take();
    }

    /// The executor's jobs and counters, for the admin API (None: it did not
    /// answer in time, or it is gone). Blocks: call it off the async runtime.
    pub fn report(&self, timeout: Duration) -> Option<msg::Report> {
        if self.is_dead() {
            return None;
        }
        let id = self
            .next_report
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.reports).insert(id, tx);
        self.send(to_executor::Msg::ReportRequest(msg::ReportRequest { id }));
        let report = rx.recv_timeout(timeout).ok();
        lock(&self.reports).remove(&id);
        report
    }
}

/// The job a message acts on, if it names one.
fn named_job(message: &to_supervisor::Msg) -> Option<u64> {
    use to_supervisor::Msg;
    match message {
        Msg::AddJob(m) => Some(m.job),
        Msg::OpenJob(m) => Some(m.job),
        Msg::RemoveJob(m) => Some(m.job),
        Msg::SetFingerprint(m) => Some(m.job),
        Msg::Want(m) => Some(m.job),
        Msg::CheapRun(m) => Some(m.job),
        Msg::Admit(m) => Some(m.job),
        Msg::Withdraw(m) => Some(m.job),
        Msg::Release(m) => Some(m.job),
        Msg::SetHints(m) => Some(m.job),
        Msg::Query(msg::Query {
            what: Some(msg::query::What::Outranked(job)),
            ..
        }) => Some(*job),
        Msg::Query(_)
        | Msg::Replayed(_)
        | Msg::Hello(_)
        | Msg::Done(_)
        | Msg::Cancel(_)
        | Msg::Drained(_)
        | Msg::Report(_) => None,
    }
}

/// How long an adopted job's memory may take to be restored.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(5);

/// One wanted iteration, queued in the core.
struct Turn {
    link: Arc<Link>,
    turn: u64,
    job: JobId,
    ran: bool,
    /// An adopted executor runs it already: no Go, only the wait for Done.
    running_already: bool,
}

impl RemoteIteration for Turn {
    fn requester_gone(&self) -> bool {
        self.link.is_dead() || lock(&self.link.cancelled).contains(&self.turn)
    }

    fn run(mut self: Box<Self>) {
        self.ran = true;
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut running = lock(&self.link.running);
            if self.running_already && lock(&self.link.done_early).remove(&self.turn) {
                return;
            }
            running.insert(self.turn, tx);
        }
        if !self.running_already {
            self.link.send(to_executor::Msg::Go(msg::Go {
                turn: self.turn,
                sent_mono_ns: crate::seam::mono_ns(),
            }));
        }
        // Done, or the executor's death (which drops the sender), or the
        // hold limit.
        let Some(limit) = self.link.hold_limit else {
            let _ = rx.recv();
            return;
        };
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            // Its Done, if it still comes, finds no waiter and is ignored.
            if lock(&self.link.running).remove(&self.turn).is_some() {
                self.link.executor.count_released_hold();
                tracing::warn!(
                    tenant = %self.link.owner,
                    job = self.job.0,
                    limit_s = limit.as_secs_f64(),
                    "a main iteration held its lane past --lane-hold-limit: other jobs' \
                     iterations start beside it (it runs on, charged the limit as device time)"
                );
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if lock(&self.link.cancelled).remove(&self.turn) {
            return; // the executor gave it up itself
        }
        if self.running_already {
            lock(&self.link.adopted_running).remove(&self.turn);
            lock(&self.link.done_early).remove(&self.turn);
        }
        if !self.ran && !self.running_already {
            self.link.send(to_executor::Msg::Dropped(msg::Dropped {
                turn: self.turn,
                reason: "the iteration was dropped before it ran: its session closed, its \
                         deadline passed, or the server is stopping"
                    .into(),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::policy::by_name;
    use crate::sched::{Hints, SchedConfig};

    fn send(to: &mut UnixStream, message: to_supervisor::Msg) {
        write_frame(to, &msg::ToSupervisor { msg: Some(message) }).unwrap();
    }

    fn answer(from: &mut UnixStream) -> to_executor::Msg {
        read_frame::<_, msg::ToExecutor>(from)
            .unwrap()
            .and_then(|m| m.msg)
            .expect("an answer")
    }

    #[test]
    fn an_executor_reaches_only_its_own_jobs() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let core = Executor::new(by_name("fifo").unwrap(), SchedConfig::default());
        // Another tenant's job, of another executor's range.
        let victim = JobId(5 << 32);
        core.open_job(victim, "victim", JobKind::Graph, Some(&Tenant::named("other")))
            .unwrap();
        core.add_job(victim, LaneId(0), Hints::default()).unwrap();

        let (ours, theirs) = UnixStream::pair().unwrap();
        let (link, _hello) = Link::start(
            ours,
            core.clone(),
            None,
            runtime.handle().clone(),
            "test".into(),
            Tenant::named("hostile"),
            None,
            1 << 32..2 << 32,
        )
        .unwrap();
        let mut executor = theirs;
        let mut reading = executor.try_clone().unwrap();

        send(&mut executor, to_supervisor::Msg::RemoveJob(msg::RemoveJob { job: victim.0, end: String::new() }));
        send(
            &mut executor,
            to_supervisor::Msg::SetHints(msg::SetHints {
                job: victim.0,
                hints: Some(msg::JobHints {
                    priority: 1000,
                    ..Default::default()
                }),
            }),
        );
        send(
            &mut executor,
            to_supervisor::Msg::Want(msg::Want {
                turn: 1,
                job: victim.0,
                deadline_ms: 0,
                running: false,
            }),
        );
        match answer(&mut reading) {
            to_executor::Msg::Dropped(d) => {
                assert_eq!(d.turn, 1);
                assert!(d.reason.contains("not this executor's"), "{}", d.reason);
            }
            other => panic!("{other:?}"),
        }
        send(
            &mut executor,
            to_supervisor::Msg::OpenJob(msg::OpenJob {
                job: victim.0,
                name: "stolen".into(),
                eager: false,
                id: 2,
            }),
        );
        match answer(&mut reading) {
            to_executor::Msg::Opened(o) => {
                assert_eq!(o.id, 2);
                let code = o.error.expect("refused").code;
                assert_eq!(code, salus_proto::tensorflow::error::Code::PermissionDenied as i32);
            }
            other => panic!("{other:?}"),
        }
        let status = core.job_status(victim).expect("the victim's job is still there");
        assert_eq!(status.hints.priority, Hints::default().priority);
        assert_eq!(status.queued, 0, "no iteration was queued for it");
        assert_eq!(link.foreign_messages(), 4);

        // Its own jobs open.
        send(
            &mut executor,
            to_supervisor::Msg::OpenJob(msg::OpenJob {
                job: (1 << 32) + 1,
                name: "mine".into(),
                eager: false,
                id: 3,
            }),
        );
        match answer(&mut reading) {
            to_executor::Msg::Opened(o) => assert_eq!((o.id, o.error), (3, None)),
            other => panic!("{other:?}"),
        }
        assert_eq!(link.open_jobs(), 1);
    }
}
