//! The supervisor's end of one executor's seam: its requests go to the one
//! scheduler core and the one memory admission (the runtime's `Executor` and
//! `Admission`, as in a single-process server), and the answers go back.
//!
//! The executor runs as its tenant, so the tenant owns it: it can stop it,
//! and through any bug of ours make it say anything. Everything here treats
//! its bytes as a client's:
//! - **What it may name.** Every message naming a job must name one it opened
//!   through `OpenJob` here (in its id range, given at its start); a job joins
//!   the scheduler only on the lane this supervisor granted it; hints are
//!   capped by its tenant's limits wherever they are used; names, counts of
//!   jobs, of wanted turns and of admissions are bounded. A refusal is
//!   answered where the executor waits, and counted.
//! - **What it may hold.** A wanted main iteration is queued in the core as a
//!   [`Turn`]: when the core picks it, the lane thread sends Go and waits for
//!   Done, so the lane is held for exactly the iteration, in whichever process
//!   it runs, or for the lane hold limit at most (an iteration blocked on a
//!   queue nobody fills runs on while the lane starts others). An executor
//!   that is stopped (its supervisor sees it, [`Link::stopped`]) or silent (a
//!   Ping unanswered for `--silence-limit`) gives its lanes back at once, and
//!   its picked turns wait aside until it runs again ([`Standing`]).
//! - **What it may block.** Nothing is written to it on a shared thread: an
//!   [`Outbox`] queues frames for a writer of its own, and an executor that
//!   lets the queue fill is ended.
//!
//! When the executor dies, [`Link::die`] forgets its jobs, returns their
//! memory and wakes every lane thread waiting on it.

mod outbox;
#[cfg(test)]
mod rogue_tests;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub use outbox::{NotSent, Outbox, OUTBOX_CAPACITY};

use crate::runtime::admission::{Admission, LaneReservation};
use crate::runtime::executor::{Executor, RemoteIteration};
use crate::runtime::run_class::RunClass;
use crate::runtime::timeline::JobKind;
use crate::sched::lanes::MemoryNeed;
use crate::sched::{JobId, LaneId, RunEnd};
use crate::seam::frame::read_frame;
use crate::seam::hints_from_msg;
use crate::seam::msg::{self, to_executor, to_supervisor};
use crate::supervisor::pidfd::ExecutorProcess;
use crate::sync::lock;
use crate::tenant::identity::Tenant;
use salus_proto::tensorflow::error::Code;

/// Bounds on what one executor may ask the supervisor to keep.
pub const MAX_OPEN_JOBS: usize = 4096;
pub const MAX_WANTED_TURNS: usize = 4096;
pub const MAX_ADMITTING: usize = 1024;
pub const MAX_JOB_NAME: usize = 1024;
pub const MAX_FINGERPRINT: usize = 256;
/// A go-ahead's delay beyond this is a lie, not a measurement.
const MAX_GO_DELAY_NS: u64 = 10_000_000_000;

/// How the supervisor sees an executor, for the turns it gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Serving,
    /// Stopped by a signal (SIGSTOP, SIGTSTP, ...), as its parent saw.
    Stopped,
    /// It left a Ping unanswered for the silence limit.
    Silent,
}

impl Standing {
    pub fn name(self) -> &'static str {
        match self {
            Standing::Serving => "serving",
            Standing::Stopped => "stopped",
            Standing::Silent => "silent",
        }
    }
}

/// Who the executor at the other end is, and the limits it runs under.
pub struct LinkSpec {
    /// For thread names and logs: `tenant:pid`.
    pub label: String,
    /// The executor's tenant: the owner of every job it opens.
    pub owner: Tenant,
    /// Longest wait for an iteration's Done before its lane moves on.
    pub hold_limit: Option<Duration>,
    /// The job ids this executor may name (`SALUS_EXECUTOR_JOB_BASE` on).
    pub job_ids: Range<u64>,
    /// Longest a Ping may go unanswered while the executor holds a lane
    /// (None: never pinged).
    pub silence_limit: Option<Duration>,
    pub process: Arc<ExecutorProcess>,
}

/// The lane threads waiting on this executor, and the turns set aside while
/// it does not run; under one lock, so that a turn never starts on a lane
/// just as its executor is found stopped.
struct Lanes {
    standing: Standing,
    /// Lane threads waiting for an iteration's Done, by turn (with its job).
    waiting: HashMap<u64, (JobId, mpsc::SyncSender<()>)>,
    /// Iterations that had their go-ahead when the executor stopped: they
    /// go on computing the moment it continues, so they are queued again
    /// then, to hold a lane (without a new Go) until their Done.
    interrupted: Vec<(u64, JobId)>,
    /// Turns the core picked while the executor was not serving.
    parked: Vec<Box<Turn>>,
}

/// Wanted turns the core holds for this executor.
#[derive(Default)]
struct Wanted {
    /// Queued or parked, not yet run or dropped.
    turns: HashSet<u64>,
    /// Of those, the ones whose requester left before their go-ahead.
    cancelled: HashSet<u64>,
    /// Iterations an adopted executor was running at its adoption (their
    /// go-ahead came from the old supervisor), and those of them whose Done
    /// came before the core picked them.
    adopted_running: HashSet<u64>,
    done_early: HashSet<u64>,
}

/// When the executor was last heard, and the Ping it has not answered.
struct Heard {
    last: Instant,
    ping: Option<Instant>,
}

pub struct Link {
    outbox: Outbox,
    /// The seam socket, to end it from here (an executor that let its outbox fill).
    control: UnixStream,
    executor: Executor,
    admission: Option<Admission>,
    runtime: tokio::runtime::Handle,
    lanes: Mutex<Lanes>,
    wanted: Mutex<Wanted>,
    /// The jobs it opened here (and that have not left).
    jobs: Mutex<HashSet<JobId>>,
    reservations: Mutex<HashMap<JobId, LaneReservation>>,
    /// Admissions it waits for.
    admitting: AtomicUsize,
    reports: Mutex<HashMap<u64, mpsc::SyncSender<msg::Report>>>,
    next_id: AtomicU64,
    hello: Mutex<Option<oneshot::Sender<msg::Hello>>>,
    spec: LinkSpec,
    heard: Mutex<Heard>,
    /// Set while Silent, so that hearing from it needs no other lock.
    silent: AtomicBool,
    answers_pings: AtomicBool,
    /// Messages refused (a job not its own or not opened, a lane not
    /// granted, a bound passed).
    refused: AtomicU64,
    replayed: AtomicBool,
    dead: AtomicBool,
    /// Set when the executor, shutting down, has drained its eager jobs (or died).
    drained: tokio::sync::watch::Sender<bool>,
}

impl Link {
    /// Starts the reader thread (and the writer's, and the watch for
    /// silence); `hello` receives the executor's Hello (it is serving). The
    /// reader ends, and the link dies, when the executor's end closes.
    pub fn start(
        stream: UnixStream,
        executor: Executor,
        admission: Option<Admission>,
        runtime: tokio::runtime::Handle,
        spec: LinkSpec,
    ) -> std::io::Result<(Arc<Link>, oneshot::Receiver<msg::Hello>)> {
        let reader = stream.try_clone()?;
        let control = stream.try_clone()?;
        let outbox = Outbox::start(stream, &spec.label)?;
        let (hello_tx, hello_rx) = oneshot::channel();
        let label = spec.label.clone();
        let link = Arc::new(Link {
            outbox,
            control,
            executor,
            admission,
            runtime,
            lanes: Mutex::new(Lanes {
                standing: Standing::Serving,
                waiting: HashMap::new(),
                interrupted: Vec::new(),
                parked: Vec::new(),
            }),
            wanted: Mutex::new(Wanted::default()),
            jobs: Mutex::new(HashSet::new()),
            reservations: Mutex::new(HashMap::new()),
            admitting: AtomicUsize::new(0),
            reports: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            hello: Mutex::new(Some(hello_tx)),
            spec,
            heard: Mutex::new(Heard {
                last: Instant::now(),
                ping: None,
            }),
            silent: AtomicBool::new(false),
            answers_pings: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            replayed: AtomicBool::new(false),
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
                        Ok(Some(message)) => {
                            reading.heard();
                            reading.handle(message)
                        }
                        Ok(None) => break,
                        Err(err) => {
                            tracing::error!(executor = %label, cause = %err, "the seam to an executor failed");
                            break;
                        }
                    }
                }
                reading.die();
            })?;
        if let Some(limit) = link.spec.silence_limit {
            let watched = Arc::downgrade(&link);
            std::thread::Builder::new()
                .name(format!("salus-watch-{}", link.spec.label))
                .spawn(move || watch_silence(watched, limit))?;
        }
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

    /// The executor's process, named by a pidfd.
    pub fn process(&self) -> &Arc<ExecutorProcess> {
        &self.spec.process
    }

    /// Open jobs of this executor the scheduler knows.
    pub fn open_jobs(&self) -> usize {
        lock(&self.jobs).len()
    }

    pub fn standing(&self) -> Standing {
        lock(&self.lanes).standing
    }

    /// An adopted executor's Hello came through the rendezvous, not here.
    pub fn set_answers_pings(&self, answers: bool) {
        self.answers_pings.store(answers, Ordering::SeqCst);
    }

    /// Messages refused so far.
    pub fn refused_messages(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn send(&self, message: to_executor::Msg) {
        if self.is_dead() {
            return;
        }
        match self.outbox.send(message) {
            Ok(()) => {}
            Err(NotSent::Closed) => {
                // The reader sees the end too and cleans up.
                self.dead.store(true, Ordering::SeqCst);
            }
            Err(NotSent::Full) => {
                if !self.dead.swap(true, Ordering::SeqCst) {
                    tracing::error!(
                        tenant = %self.spec.owner,
                        executor = %self.spec.label,
                        queued = OUTBOX_CAPACITY,
                        "an executor stopped reading its seam and let {OUTBOX_CAPACITY} messages queue up: \
                         ending it (its jobs end)"
                    );
                    self.spec.process.signal_or_log(libc::SIGKILL);
                    let _ = self.control.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }

    /// Whether `job` is one of this executor's (in its id range).
    pub fn owns_job(&self, job: u64) -> bool {
        self.spec.job_ids.contains(&job)
    }

    /// Counts a refused message, logging the first; answers it where the
    /// executor waits for an answer.
    fn refuse(&self, message: to_supervisor::Msg, code: Code, why: String) {
        if self.refused.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                tenant = %self.spec.owner,
                executor = %self.spec.label,
                "an executor's message was refused: {why} (later ones are counted, not logged)"
            );
        }
        let refusal = || msg::AdmitError {
            code: code as i32,
            message: why.clone(),
        };
        match message {
            to_supervisor::Msg::OpenJob(open) if open.id != 0 => {
                self.send(to_executor::Msg::Opened(msg::Opened {
                    id: open.id,
                    error: Some(refusal()),
                }))
            }
            to_supervisor::Msg::Admit(admit) if !admit.held => {
                self.send(to_executor::Msg::Admitted(msg::Admitted {
                    id: admit.id,
                    outcome: Some(msg::admitted::Outcome::Error(refusal())),
                }))
            }
            to_supervisor::Msg::Want(want) if !want.running => {
                self.send(to_executor::Msg::Dropped(msg::Dropped {
                    turn: want.turn,
                    reason: why.clone(),
                }))
            }
            to_supervisor::Msg::Query(query) => self.send(to_executor::Msg::Answer(msg::Answer {
                id: query.id,
                ..Default::default()
            })),
            _ => {}
        }
    }

    /// Whether `message` is handled, ignored or refused, checked against what this
    /// supervisor knows of the executor (never what it says of itself).
    fn check(&self, message: &to_supervisor::Msg) -> Verdict {
        use to_supervisor::Msg;
        if let Some(job) = named_job(message) {
            if !self.owns_job(job) {
                return Verdict::Refuse(
                    Code::PermissionDenied,
                    format!("job {job} is not this executor's"),
                );
            }
            let opened = lock(&self.jobs).contains(&JobId(job));
            if !opened && lets_go(message) {
                // Its job left already (a release after the removal, as a
                // closing job sends them): nothing to give up, nothing to refuse.
                return Verdict::Ignore;
            }
            if !opened && !matches!(message, Msg::OpenJob(_)) {
                return Verdict::Refuse(
                    Code::FailedPrecondition,
                    format!("job {job} was not opened by this executor"),
                );
            }
        }
        match message {
            Msg::OpenJob(open) => {
                if open.name.len() > MAX_JOB_NAME {
                    return Verdict::Refuse(
                        Code::InvalidArgument,
                        format!(
                            "a job name of {} bytes (at most {MAX_JOB_NAME})",
                            open.name.len()
                        ),
                    );
                }
                if lock(&self.jobs).len() >= MAX_OPEN_JOBS {
                    return Verdict::Refuse(
                        Code::ResourceExhausted,
                        format!("this executor has {MAX_OPEN_JOBS} jobs open"),
                    );
                }
            }
            Msg::SetFingerprint(set) if set.fingerprint.len() > MAX_FINGERPRINT => {
                return Verdict::Refuse(
                    Code::InvalidArgument,
                    format!(
                        "a fingerprint of {} bytes (at most {MAX_FINGERPRINT})",
                        set.fingerprint.len()
                    ),
                );
            }
            Msg::Want(want) => {
                let wanted = lock(&self.wanted);
                if wanted.turns.contains(&want.turn) {
                    return Verdict::Refuse(
                        Code::InvalidArgument,
                        format!("turn {} is wanted already", want.turn),
                    );
                }
                if wanted.turns.len() >= MAX_WANTED_TURNS {
                    return Verdict::Refuse(
                        Code::ResourceExhausted,
                        format!("this executor has {MAX_WANTED_TURNS} iterations queued"),
                    );
                }
            }
            Msg::Admit(_) if self.admitting.load(Ordering::SeqCst) >= MAX_ADMITTING => {
                return Verdict::Refuse(
                    Code::ResourceExhausted,
                    format!("this executor waits for {MAX_ADMITTING} admissions"),
                );
            }
            _ => {}
        }
        Verdict::Handle
    }

    fn handle(self: &Arc<Self>, message: msg::ToSupervisor) {
        let Some(message) = message.msg else { return };
        match self.check(&message) {
            Verdict::Handle => {}
            Verdict::Ignore => return,
            Verdict::Refuse(code, why) => return self.refuse(message, code, why),
        }
        match message {
            to_supervisor::Msg::Hello(hello) => {
                if let Some(tx) = lock(&self.hello).take() {
                    self.set_answers_pings(hello.answers_pings);
                    let _ = tx.send(hello);
                }
            }
            to_supervisor::Msg::AddJob(add) => self.add_job(add),
            to_supervisor::Msg::OpenJob(open) => self.open_job(open),
            to_supervisor::Msg::RemoveJob(remove) => {
                let end = RunEnd::from_name(&remove.end).unwrap_or(RunEnd::Cancelled);
                self.forget(JobId(remove.job), end)
            }
            to_supervisor::Msg::SetFingerprint(set) => self
                .executor
                .set_fingerprint(JobId(set.job), &set.fingerprint),
            to_supervisor::Msg::Want(want) => self.want(want),
            to_supervisor::Msg::Done(done) => {
                if done.go_delay_ns > 0 && done.go_delay_ns < MAX_GO_DELAY_NS {
                    self.executor.record_handover(done.go_delay_ns);
                }
                let mut lanes = lock(&self.lanes);
                if let Some((_, tx)) = lanes.waiting.remove(&done.turn) {
                    let _ = tx.send(());
                } else {
                    let mut wanted = lock(&self.wanted);
                    if wanted.adopted_running.remove(&done.turn) {
                        // Ended before the core picked it: its lane need not wait.
                        wanted.done_early.insert(done.turn);
                    }
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
            to_supervisor::Msg::Cancel(cancel) => {
                let mut wanted = lock(&self.wanted);
                // Only a turn it wants: anything else would only grow the set.
                if wanted.turns.contains(&cancel.turn) {
                    wanted.cancelled.insert(cancel.turn);
                }
            }
            to_supervisor::Msg::Replayed(_) => {
                if !self.replayed.swap(true, Ordering::SeqCst) {
                    tracing::info!(tenant = %self.spec.owner, jobs = self.open_jobs(), "an adopted executor's jobs are scheduled here now");
                }
            }
            to_supervisor::Msg::Drained(_) => {
                self.drained.send_replace(true);
            }
            to_supervisor::Msg::Report(report) => {
                if let Some(tx) = lock(&self.reports).remove(&report.id) {
                    let _ = tx.send(report);
                }
            }
            to_supervisor::Msg::Pong(_) => {} // heard, which is all it says
        }
    }

    fn open_job(&self, open: msg::OpenJob) {
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
            self.executor
                .reopen_job(job, &open.name, kind, Some(&self.spec.owner))
        } else {
            self.executor
                .open_job(job, &open.name, kind, Some(&self.spec.owner))
        };
        let error = opened.err().map(|err| {
            lock(&self.jobs).remove(&job);
            msg::AdmitError {
                code: err.code() as i32,
                message: err.to_string(),
            }
        });
        if open.id == 0 {
            // An adopted executor's job, open already: no one waits.
            if let Some(err) = error {
                tracing::warn!(tenant = %self.spec.owner, job = open.job, "an adopted job was refused: {}", err.message);
            }
        } else {
            self.send(to_executor::Msg::Opened(msg::Opened { id: open.id, error }));
        }
    }

    /// The job joins the scheduler on the lane this supervisor gave it:
    /// its admission's lane where memory is admitted (after an adoption the
    /// lanes are this admission's), lane 0 where it is not; whatever lane the
    /// executor names.
    fn add_job(&self, add: msg::AddJob) {
        let job = JobId(add.job);
        let lane = match (&self.admission, lock(&self.reservations).get(&job)) {
            (_, Some(reservation)) => reservation.lane(),
            (None, None) => LaneId(0),
            (Some(_), None) => {
                let why = format!(
                    "job {} joins the scheduler without memory admitted for it (lane {} was never granted)",
                    add.job, add.lane
                );
                self.refuse(
                    to_supervisor::Msg::AddJob(add),
                    Code::FailedPrecondition,
                    why,
                );
                return;
            }
        };
        if let Err(err) = self.executor.add_job(job, lane, hints_from_msg(add.hints)) {
            tracing::debug!(job = add.job, cause = %err, "an executor's job could not join the scheduler");
        }
    }

    fn want(self: &Arc<Self>, want: msg::Want) {
        let deadline = (want.deadline_ms > 0)
            .then(|| Instant::now() + Duration::from_millis(want.deadline_ms));
        {
            let mut wanted = lock(&self.wanted);
            wanted.turns.insert(want.turn);
            if want.running {
                wanted.adopted_running.insert(want.turn);
            }
        }
        let iteration = Box::new(Turn {
            link: self.clone(),
            turn: want.turn,
            job: JobId(want.job),
            deadline,
            ran: false,
            running_already: want.running,
        });
        // On refusal the iteration is dropped, which tells the executor.
        let _ = self
            .executor
            .submit_remote(JobId(want.job), deadline, iteration);
    }

    fn admit(self: &Arc<Self>, admit: msg::Admit) {
        let link = self.clone();
        let Some(admission) = self.admission.clone() else {
            self.send(to_executor::Msg::Admitted(msg::Admitted {
                id: admit.id,
                outcome: Some(msg::admitted::Outcome::Error(msg::AdmitError {
                    code: Code::FailedPrecondition as i32,
                    message: "this server has no memory capacity (--memory-capacity)".into(),
                })),
            }));
            return;
        };
        self.admitting.fetch_add(1, Ordering::SeqCst);
        self.runtime.spawn(async move {
            let job = JobId(admit.job);
            let need = MemoryNeed {
                persistent: admit.persistent,
                ephemeral: admit.ephemeral,
            };
            // Its hints are capped by its tenant's limits in the rank and
            // when it joins the scheduler.
            let outcome = admission
                .admit(
                    job,
                    need,
                    admit.pinned_lane.map(LaneId),
                    hints_from_msg(admit.hints),
                )
                .await;
            link.admitting.fetch_sub(1, Ordering::SeqCst);
            let outcome = match outcome {
                Ok(reservation) => {
                    let lane = reservation.lane();
                    if link.is_dead() || !lock(&link.jobs).contains(&job) {
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
            admission.admit(
                job,
                need,
                admit.pinned_lane.map(LaneId),
                hints_from_msg(admit.hints),
            ),
        ));
        match restored {
            Ok(Ok(reservation)) => {
                lock(&self.reservations).insert(job, reservation);
            }
            Ok(Err(err)) => {
                tracing::warn!(tenant = %self.spec.owner, job = admit.job, cause = %err, "an adopted job's memory could not be restored")
            }
            Err(_) => {
                admission.withdraw(job);
                tracing::warn!(tenant = %self.spec.owner, job = admit.job, "an adopted job's memory could not be restored in time (the device is fuller than before the restart)")
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

    /// Its parent saw the executor stop (SIGSTOP and the like): its lanes
    /// go to others at once, and its turns wait until it continues.
    pub fn stopped(&self) {
        self.suspend(Standing::Stopped);
    }

    /// Its parent saw the executor continue (SIGCONT).
    pub fn continued(self: &Arc<Self>) {
        if self.standing() == Standing::Stopped {
            self.resume();
        }
    }

    fn suspend(&self, standing: Standing) {
        let released = {
            let mut lanes = lock(&self.lanes);
            if lanes.standing == standing || lanes.standing == Standing::Stopped {
                return;
            }
            lanes.standing = standing;
            self.silent
                .store(standing == Standing::Silent, Ordering::SeqCst);
            // Dropping a waiter's sender wakes its lane thread: the lane is free.
            let interrupted: Vec<(u64, JobId)> = lanes
                .waiting
                .drain()
                .map(|(turn, (job, _))| (turn, job))
                .collect();
            let mut wanted = lock(&self.wanted);
            for &(turn, _) in &interrupted {
                // Its Done may come before it is picked again (see `Turn::run`).
                wanted.turns.insert(turn);
                wanted.adopted_running.insert(turn);
            }
            drop(wanted);
            let released = interrupted.len();
            lanes.interrupted.extend(interrupted);
            released
        };
        for _ in 0..released {
            self.executor.count_released_hold();
        }
        tracing::warn!(
            tenant = %self.spec.owner,
            executor = %self.spec.label,
            lanes_released = released,
            "an executor is {}: its lanes go to other jobs, and its iterations wait until it runs again{}",
            standing.name(),
            if standing == Standing::Silent {
                " (it left a ping unanswered for --silence-limit)"
            } else {
                ""
            }
        );
    }

    fn resume(self: &Arc<Self>) {
        let parked = {
            let mut lanes = lock(&self.lanes);
            if lanes.standing == Standing::Serving {
                return;
            }
            lanes.standing = Standing::Serving;
            self.silent.store(false, Ordering::SeqCst);
            let mut parked = std::mem::take(&mut lanes.parked);
            parked.extend(lanes.interrupted.drain(..).map(|(turn, job)| {
                Box::new(Turn {
                    link: self.clone(),
                    turn,
                    job,
                    deadline: None,
                    ran: false,
                    running_already: true,
                })
            }));
            parked
        };
        tracing::info!(
            tenant = %self.spec.owner,
            executor = %self.spec.label,
            turns = parked.len(),
            "an executor runs again: its iterations are queued again"
        );
        // Stopping is no way to bank device time for a burst later.
        self.executor.forfeit_credit(&self.spec.owner);
        for turn in parked {
            let (job, deadline) = (turn.job, turn.deadline);
            // A turn whose job left meanwhile is dropped, which tells the executor.
            let _ = self.executor.submit_remote(job, deadline, turn);
        }
    }

    /// A frame came: the executor runs and reads its seam.
    fn heard(self: &Arc<Self>) {
        lock(&self.heard).last = Instant::now();
        if self.silent.load(Ordering::SeqCst) {
            self.resume();
        }
    }

    /// One look of the silence watch: pings an executor that holds a lane
    /// and has not been heard for half the limit; suspends one that left a
    /// ping unanswered for the whole limit.
    fn watch_once(&self, limit: Duration) {
        if !self.answers_pings.load(Ordering::SeqCst) {
            return;
        }
        let holding = {
            let lanes = lock(&self.lanes);
            lanes.standing == Standing::Serving && !lanes.waiting.is_empty()
        };
        let now = Instant::now();
        let mut heard = lock(&self.heard);
        match heard.ping {
            Some(sent) if heard.last >= sent => heard.ping = None,
            Some(sent) if now.duration_since(sent) >= limit => {
                heard.ping = None;
                drop(heard);
                if holding {
                    self.suspend(Standing::Silent);
                }
                return;
            }
            _ => {}
        }
        if holding && heard.ping.is_none() && now.duration_since(heard.last) >= limit / 2 {
            heard.ping = Some(now);
            drop(heard);
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.send(to_executor::Msg::Ping(msg::Ping { id }));
        }
    }

    /// The executor is gone: all its jobs leave, lane threads waiting on it wake.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.drained.send_replace(true);
        let jobs: Vec<JobId> = lock(&self.jobs).iter().copied().collect();
        for job in jobs {
            self.forget(job, RunEnd::Failed);
        }
        let parked = {
            let mut lanes = lock(&self.lanes);
            lanes.waiting.clear();
            lanes.interrupted.clear();
            std::mem::take(&mut lanes.parked)
        };
        drop(parked);
        lock(&self.reports).clear();
        lock(&self.reservations).clear();
        lock(&self.hello).take();
    }

    /// The executor's jobs and counters, for the admin API (None: it did not
    /// answer in time, or it is gone). Blocks: call it off the async runtime.
    pub fn report(&self, timeout: Duration) -> Option<msg::Report> {
        if self.is_dead() || self.standing() != Standing::Serving {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.reports).insert(id, tx);
        self.send(to_executor::Msg::ReportRequest(msg::ReportRequest { id }));
        let report = rx.recv_timeout(timeout).ok();
        lock(&self.reports).remove(&id);
        report
    }
}

/// Looks for silence every quarter of the limit while the link lives.
fn watch_silence(link: std::sync::Weak<Link>, limit: Duration) {
    let tick = (limit / 4).max(Duration::from_millis(10));
    loop {
        std::thread::sleep(tick);
        let Some(link) = link.upgrade() else { return };
        if link.is_dead() {
            return;
        }
        link.watch_once(limit);
    }
}

/// What [`Link::check`] makes of a message.
enum Verdict {
    Handle,
    /// A job that left already lets go of something: nothing to do.
    Ignore,
    /// Answered (where the executor waits) with this code and reason, and counted.
    Refuse(Code, String),
}

/// Whether a message only gives something of its job up (or reports on it),
/// so that one naming a job that left already is ignored, not refused.
fn lets_go(message: &to_supervisor::Msg) -> bool {
    use to_supervisor::Msg;
    matches!(
        message,
        Msg::RemoveJob(_) | Msg::Release(_) | Msg::Withdraw(_) | Msg::CheapRun(_)
    )
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
        | Msg::Report(_)
        | Msg::Pong(_) => None,
    }
}

/// How long an adopted job's memory may take to be restored.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(5);

/// One wanted iteration, queued in the core.
struct Turn {
    link: Arc<Link>,
    turn: u64,
    job: JobId,
    deadline: Option<Instant>,
    ran: bool,
    /// An adopted executor runs it already: no Go, only the wait for Done.
    running_already: bool,
}

impl RemoteIteration for Turn {
    fn requester_gone(&self) -> bool {
        self.link.is_dead() || lock(&self.link.wanted).cancelled.contains(&self.turn)
    }

    fn run(mut self: Box<Self>) {
        let link = self.link.clone();
        let turn = self.turn;
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut lanes = lock(&link.lanes);
            if self.running_already && lock(&link.wanted).done_early.remove(&turn) {
                self.ran = true;
                return;
            }
            if lanes.standing != Standing::Serving {
                // Its executor does not run: the lane goes on at once, and
                // the turn waits aside until the executor runs again.
                lanes.parked.push(self);
                return;
            }
            self.ran = true;
            lanes.waiting.insert(turn, (self.job, tx));
        }
        if !self.running_already {
            link.send(to_executor::Msg::Go(msg::Go {
                turn,
                sent_mono_ns: crate::seam::mono_ns(),
            }));
        }
        let job = self.job;
        // Not dropped while the lane waits: its drop ends the wanted turn.
        // Done, or the executor's death or stop (which drop the sender), or
        // the hold limit.
        let Some(limit) = link.spec.hold_limit else {
            let _ = rx.recv();
            return;
        };
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            // Its Done, if it still comes, finds no waiter and is ignored.
            if lock(&link.lanes).waiting.remove(&turn).is_some() {
                link.executor.count_released_hold();
                tracing::warn!(
                    tenant = %link.spec.owner,
                    job = job.0,
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
        let cancelled = {
            let mut wanted = lock(&self.link.wanted);
            wanted.turns.remove(&self.turn);
            if self.running_already {
                wanted.adopted_running.remove(&self.turn);
                wanted.done_early.remove(&self.turn);
            }
            wanted.cancelled.remove(&self.turn)
        };
        if cancelled {
            return; // the executor gave it up itself
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
    use crate::seam::frame::write_frame;

    fn send(to: &mut UnixStream, message: to_supervisor::Msg) {
        write_frame(to, &msg::ToSupervisor { msg: Some(message) }).unwrap();
    }

    pub(super) fn test_spec(tenant: &str, job_ids: Range<u64>) -> LinkSpec {
        LinkSpec {
            label: format!("{tenant}:test"),
            owner: Tenant::named(tenant),
            hold_limit: None,
            job_ids,
            silence_limit: None,
            process: Arc::new(ExecutorProcess::open(std::process::id())),
        }
    }

    fn answer(from: &mut UnixStream) -> to_executor::Msg {
        read_frame::<_, msg::ToExecutor>(from)
            .unwrap()
            .and_then(|m| m.msg)
            .expect("an answer")
    }

    #[test]
    fn an_executor_reaches_only_its_own_jobs() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let core = Executor::new(by_name("fifo").unwrap(), SchedConfig::default());
        // Another tenant's job, of another executor's range.
        let victim = JobId(5 << 32);
        core.open_job(
            victim,
            "victim",
            JobKind::Graph,
            Some(&Tenant::named("other")),
        )
        .unwrap();
        core.add_job(victim, LaneId(0), Hints::default()).unwrap();

        let (ours, theirs) = UnixStream::pair().unwrap();
        let (link, _hello) = Link::start(
            ours,
            core.clone(),
            None,
            runtime.handle().clone(),
            test_spec("hostile", 1 << 32..2 << 32),
        )
        .unwrap();
        let mut executor = theirs;
        let mut reading = executor.try_clone().unwrap();

        send(
            &mut executor,
            to_supervisor::Msg::RemoveJob(msg::RemoveJob {
                job: victim.0,
                end: String::new(),
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
                assert_eq!(
                    code,
                    salus_proto::tensorflow::error::Code::PermissionDenied as i32
                );
            }
            other => panic!("{other:?}"),
        }
        let status = core
            .job_status(victim)
            .expect("the victim's job is still there");
        assert_eq!(status.hints.priority, Hints::default().priority);
        assert_eq!(status.queued, 0, "no iteration was queued for it");
        assert_eq!(link.refused_messages(), 3);

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
