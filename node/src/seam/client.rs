//! The executor's end of the seam: what the runtime's `Executor` and
//! `Admission` become in a tenant's executor process. Scheduling and memory
//! decisions are the supervisor's; this side asks and waits.
//!
//! One writer lock (frames are written whole) and one reader thread, which
//! routes each answer to the waiting caller. Waits for a turn happen on
//! blocking threads, never on the async runtime; an admission waits as a future.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::sched::lanes::MemoryNeed;
use crate::sched::{Hints, JobId, LaneId};
use crate::seam::frame::{read_frame, write_frame};
use crate::seam::hints_to_msg;
use crate::seam::mirror::Mirror;
use crate::seam::msg::{self, to_executor, to_supervisor};
use crate::sync::lock;
use crate::tf_types::TfError;

/// What the supervisor said of a wanted turn.
enum TurnOutcome {
    /// When the supervisor sent it (CLOCK_MONOTONIC ns).
    Go(u64),
    Dropped(String),
    /// No supervisor adopted the executor in time: why.
    Unavailable(String),
}

/// What the executor does when its supervisor is gone.
pub enum WhenOrphaned {
    /// Nothing can adopt it: this runs at once (it ends the process).
    Exit(Box<dyn FnOnce() + Send>),
    /// Wait up to `grace` for a new supervisor to adopt it (`SeamClient::adopt`),
    /// holding every request that needs the supervisor; after that, fail them
    /// with UNAVAILABLE and why, and run `exit` [`LINGER`] later, so those
    /// answers reach the clients.
    Wait {
        grace: Duration,
        exit: Box<dyn Fn() + Send + Sync>,
    },
}

/// How long an executor that no supervisor adopted keeps answering its
/// clients (with the reason) before it exits.
pub const LINGER: Duration = Duration::from_secs(5);

/// The seam's writing end and what crossed it.
struct Outgoing {
    /// None while no supervisor holds the other end.
    stream: Option<UnixStream>,
    mirror: Mirror,
    /// Bumped at each adoption: a reader of an earlier stream that ends is stale.
    generation: u64,
}

/// Builds the executor's report (its jobs and counters) for the admin API.
pub type Reporter = Box<dyn Fn() -> msg::Report + Send + Sync>;

pub struct SeamClient {
    out: Mutex<Outgoing>,
    next_id: AtomicU64,
    turns: Mutex<HashMap<u64, mpsc::SyncSender<TurnOutcome>>>,
    answers: Mutex<HashMap<u64, mpsc::SyncSender<msg::Answer>>>,
    admissions: Mutex<HashMap<u64, oneshot::Sender<msg::Admitted>>>,
    openings: Mutex<HashMap<u64, oneshot::Sender<msg::Opened>>>,
    closed: AtomicBool,
    /// The supervisor is gone and no new one has adopted this executor yet.
    orphaned: AtomicBool,
    when_orphaned: Mutex<Option<WhenOrphaned>>,
    /// Why the executor stopped waiting for a supervisor (it is ending).
    gave_up: OnceLock<String>,
    reporter: OnceLock<Reporter>,
    /// Recent answers to "is this job outranked?", by job: a job doing
    /// thousands of brief runs a second asks once per [`OUTRANKED_TTL`].
    outranked: Mutex<HashMap<JobId, Ranking>>,
    /// Queries refreshing a cached ranking in the background, by id.
    refreshes: Mutex<HashMap<u64, JobId>>,
    /// [`OUTRANKED_TTL`] and [`OUTRANKED_STALE`] (longer in tests, which
    /// cannot keep time).
    ranking_fresh: Duration,
    ranking_usable: Duration,
}

/// The supervisor's last answer to "is this job outranked?".
#[derive(Clone, Copy)]
struct Ranking {
    at: Instant,
    outranked: bool,
    /// A background query for a newer answer is under way.
    refreshing: bool,
}

/// How long an answer about a job's brief runs stands: a brief run may skip
/// the queue at most this long after another job's better-ranked iteration
/// queued (a round trip to the supervisor costs tens of microseconds, a brief
/// run less than a millisecond).
const OUTRANKED_TTL: Duration = Duration::from_millis(2);

/// An answer older than [`OUTRANKED_TTL`] but younger than this still decides
/// a brief run while a newer one is asked for in the background (a job running
/// back-to-back brief runs never waits for the round trip); an older one is
/// asked for and waited for.
const OUTRANKED_STALE: Duration = Duration::from_millis(4);

/// How long a query (brief-run ranking, GPU lane choice) waits for its answer
/// before the executor decides alone (the supervisor is stalled or gone).
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

impl SeamClient {
    /// Starts the reader thread on `stream`; `on_close` runs on it once the
    /// supervisor's end is gone (the executor process exits then), before
    /// waiters are told.
    pub fn start(
        stream: UnixStream,
        on_close: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Arc<SeamClient>> {
        Self::start_with(
            stream,
            WhenOrphaned::Exit(Box::new(on_close)),
            OUTRANKED_TTL,
            OUTRANKED_STALE,
        )
    }

    /// As [`SeamClient::start`], with what happens when the supervisor goes.
    pub fn start_orphanable(
        stream: UnixStream,
        when_orphaned: WhenOrphaned,
    ) -> std::io::Result<Arc<SeamClient>> {
        Self::start_with(stream, when_orphaned, OUTRANKED_TTL, OUTRANKED_STALE)
    }

    fn start_with(
        stream: UnixStream,
        when_orphaned: WhenOrphaned,
        ranking_fresh: Duration,
        ranking_usable: Duration,
    ) -> std::io::Result<Arc<SeamClient>> {
        let reader = stream.try_clone()?;
        let client = Arc::new(SeamClient {
            out: Mutex::new(Outgoing {
                stream: Some(stream),
                mirror: Mirror::default(),
                generation: 0,
            }),
            next_id: AtomicU64::new(1),
            turns: Mutex::new(HashMap::new()),
            answers: Mutex::new(HashMap::new()),
            admissions: Mutex::new(HashMap::new()),
            openings: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            when_orphaned: Mutex::new(Some(when_orphaned)),
            gave_up: OnceLock::new(),
            reporter: OnceLock::new(),
            outranked: Mutex::new(HashMap::new()),
            refreshes: Mutex::new(HashMap::new()),
            ranking_fresh,
            ranking_usable,
        });
        client.spawn_reader(reader, 0)?;
        Ok(client)
    }

    fn spawn_reader(self: &Arc<Self>, reader: UnixStream, generation: u64) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("salus-seam".into())
            .spawn(move || {
                let mut reader = reader;
                let failed = loop {
                    let message = match read_frame::<_, msg::ToExecutor>(&mut reader) {
                        Ok(Some(m)) => m,
                        Ok(None) => break None,
                        Err(err) => break Some(err),
                    };
                    let Some(client) = weak.upgrade() else {
                        break None;
                    };
                    client.dispatch(message);
                };
                if let Some(client) = weak.upgrade() {
                    client.lost(generation, failed);
                }
            })?;
        Ok(())
    }

    /// The supervisor's end of the stream of `generation` is gone.
    fn lost(self: &Arc<Self>, generation: u64, failed: Option<std::io::Error>) {
        {
            let mut out = lock(&self.out);
            if out.generation != generation {
                return;
            }
            out.stream = None;
        }
        let when = lock(&self.when_orphaned).take();
        match when {
            Some(WhenOrphaned::Wait { grace, exit }) => {
                self.orphaned.store(true, Ordering::SeqCst);
                // Queries asked of the old supervisor get no answer: their
                // askers decide alone now, not after QUERY_TIMEOUT.
                lock(&self.answers).clear();
                lock(&self.refreshes).clear();
                let (opening, admitting, wanted) = lock(&self.out).mirror.waiting();
                tracing::warn!(
                    grace_s = grace.as_secs_f64(),
                    opening,
                    admitting,
                    wanted,
                    "the supervisor is gone: holding every request that needs it until a new one adopts this executor"
                );
                let client = self.clone();
                let _ = std::thread::Builder::new()
                    .name("salus-orphan".into())
                    .spawn(move || {
                        let until = Instant::now() + grace;
                        while Instant::now() < until {
                            if lock(&client.out).generation != generation {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
                        }
                        if lock(&client.out).generation == generation {
                            client.give_up(format!(
                                "the salus-server supervisor went away and no new one adopted this executor \
                                 within --adopt-grace ({} s): its jobs end",
                                grace.as_secs()
                            ));
                            std::thread::sleep(LINGER);
                            exit();
                        } else {
                            // Adopted: the next orphaning waits again.
                            *lock(&client.when_orphaned) = Some(WhenOrphaned::Wait { grace, exit });
                        }
                    });
            }
            other => {
                // `on_close` first: in an executor it ends the process before
                // any waiter, woken by `close`, could answer a client, and
                // before anything is logged (the supervisor that would copy
                // the log is gone with the seam).
                if let Some(WhenOrphaned::Exit(on_close)) = other {
                    on_close();
                }
                if let Some(err) = failed {
                    tracing::error!(cause = %err, "the seam to the supervisor failed");
                }
                self.close();
            }
        }
    }

    /// No supervisor will come: every waiter fails with UNAVAILABLE and why.
    fn give_up(&self, why: String) {
        tracing::error!("{why}");
        let _ = self.gave_up.set(why.clone());
        self.closed.store(true, Ordering::SeqCst);
        self.orphaned.store(false, Ordering::SeqCst);
        for (_, tx) in lock(&self.turns).drain() {
            let _ = tx.send(TurnOutcome::Unavailable(why.clone()));
        }
        let refusal = || msg::AdmitError {
            code: salus_proto::tensorflow::error::Code::Unavailable as i32,
            message: why.clone(),
        };
        for (id, tx) in lock(&self.admissions).drain() {
            let _ = tx.send(msg::Admitted {
                id,
                outcome: Some(msg::admitted::Outcome::Error(refusal())),
            });
        }
        for (id, tx) in lock(&self.openings).drain() {
            let _ = tx.send(msg::Opened {
                id,
                error: Some(refusal()),
            });
        }
        lock(&self.answers).clear();
        lock(&self.refreshes).clear();
    }

    /// Whether the supervisor is gone and this executor waits to be adopted.
    pub fn is_orphaned(&self) -> bool {
        self.orphaned.load(Ordering::SeqCst)
    }

    /// A new supervisor adopts this orphaned executor over `stream`: `hello`
    /// first, then what the old supervisor knew of it, then `Replayed`; from
    /// then on the seam runs over `stream`. Held requests get their answers
    /// from the new supervisor.
    pub fn adopt(self: &Arc<Self>, stream: UnixStream, hello: msg::Hello) -> std::io::Result<()> {
        let reader = stream.try_clone()?;
        let generation = {
            let mut out = lock(&self.out);
            if !self.is_orphaned() || out.stream.is_some() {
                return Err(std::io::Error::other(
                    "this executor has a supervisor, or gave up waiting for one",
                ));
            }
            let mut stream = stream;
            let frame = |m| msg::ToSupervisor { msg: Some(m) };
            write_frame(&mut stream, &frame(to_supervisor::Msg::Hello(hello)))?;
            for message in out.mirror.replay() {
                write_frame(&mut stream, &frame(message))?;
            }
            write_frame(
                &mut stream,
                &frame(to_supervisor::Msg::Replayed(msg::Replayed {})),
            )?;
            out.stream = Some(stream);
            out.generation += 1;
            self.orphaned.store(false, Ordering::SeqCst);
            out.generation
        };
        // Rankings the old supervisor gave are stale.
        lock(&self.outranked).clear();
        self.spawn_reader(reader, generation)
    }

    /// Sets what answers the supervisor's report requests (once the
    /// executor's state exists).
    pub fn set_reporter(&self, reporter: Reporter) {
        let _ = self.reporter.set(reporter);
    }

    fn dispatch(self: &Arc<Self>, message: msg::ToExecutor) {
        if let Some(m) = &message.msg {
            lock(&self.out).mirror.received(m);
        }
        match message.msg {
            Some(to_executor::Msg::Go(go)) => {
                if let Some(tx) = lock(&self.turns).remove(&go.turn) {
                    let _ = tx.send(TurnOutcome::Go(go.sent_mono_ns));
                } else {
                    // Nobody waits any more: give the lane back at once.
                    self.send(to_supervisor::Msg::Done(msg::Done {
                        turn: go.turn,
                        go_delay_ns: 0,
                    }));
                }
            }
            Some(to_executor::Msg::Dropped(dropped)) => {
                if let Some(tx) = lock(&self.turns).remove(&dropped.turn) {
                    let _ = tx.send(TurnOutcome::Dropped(dropped.reason));
                }
            }
            Some(to_executor::Msg::Answer(answer)) => {
                if let Some(tx) = lock(&self.answers).remove(&answer.id) {
                    let _ = tx.send(answer);
                } else if let Some(job) = lock(&self.refreshes).remove(&answer.id) {
                    self.remember_ranking(job, answer.yes);
                }
            }
            Some(to_executor::Msg::Opened(opened)) => {
                if let Some(tx) = lock(&self.openings).remove(&opened.id) {
                    let _ = tx.send(opened);
                }
            }
            Some(to_executor::Msg::Admitted(admitted)) => {
                if let Some(tx) = lock(&self.admissions).remove(&admitted.id) {
                    let _ = tx.send(admitted);
                }
            }
            Some(to_executor::Msg::ReportRequest(request)) => {
                // Walks graphs under TensorFlow's locks: not on the reader thread.
                let client = self.clone();
                let _ = std::thread::Builder::new()
                    .name("salus-report".into())
                    .spawn(move || {
                        let mut report = client.reporter.get().map(|r| r()).unwrap_or_default();
                        report.id = request.id;
                        client.send(to_supervisor::Msg::Report(report));
                    });
            }
            Some(to_executor::Msg::Ping(ping)) => {
                // At once, from the reader: what the supervisor measures is
                // whether this process runs and reads its seam.
                self.send(to_supervisor::Msg::Pong(msg::Pong { id: ping.id }));
            }
            None => {}
        }
    }

    /// The supervisor is gone: every waiter gets an error.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        lock(&self.turns).clear();
        lock(&self.answers).clear();
        lock(&self.admissions).clear();
        lock(&self.openings).clear();
        lock(&self.refreshes).clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends one message; with no supervisor it is only remembered (a new
    /// supervisor learns the state it leaves), and a closed seam drops it (the
    /// process is ending).
    pub fn send(&self, message: to_supervisor::Msg) {
        let mut out = lock(&self.out);
        out.mirror.sent(&message);
        let Some(stream) = out.stream.as_mut() else {
            return;
        };
        let frame = msg::ToSupervisor { msg: Some(message) };
        if let Err(err) = write_frame(stream, &frame) {
            // The reader sees the end too, and decides what follows.
            out.stream = None;
            tracing::debug!(cause = %err, "cannot write to the supervisor");
        }
    }

    /// The error of a request that needs the supervisor once none will come.
    fn gone(&self) -> Error {
        match self.gave_up.get() {
            Some(why) => Error::Unavailable(why.clone()),
            None => Error::ShuttingDown,
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Asks the supervisor's scheduler for a main iteration of `job`; wait for
    /// it with [`SeamClient::take_turn`], or give it up with [`SeamClient::cancel`].
    pub fn want(&self, job: JobId, deadline: Option<Instant>) -> Result<WantedTurn> {
        if self.is_closed() {
            return Err(self.gone());
        }
        let turn = self.next_id();
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.turns).insert(turn, tx);
        let deadline_ms = deadline.map_or(0, |d| {
            d.saturating_duration_since(Instant::now())
                .as_millis()
                .max(1) as u64
        });
        self.send(to_supervisor::Msg::Want(msg::Want {
            turn,
            job: job.0,
            deadline_ms,
            running: false,
        }));
        Ok(WantedTurn { turn, rx })
    }

    /// The requester of `turn` is gone: unless the go-ahead came already, the
    /// supervisor drops the iteration without running it.
    pub fn cancel(&self, turn: u64) {
        if lock(&self.turns).remove(&turn).is_some() {
            self.send(to_supervisor::Msg::Cancel(msg::Cancel { turn }));
        }
    }

    /// Waits (blocking: call it off the async runtime) until the scheduler
    /// gives the wanted iteration its go-ahead; the returned guard ends it.
    pub fn take_turn(self: &Arc<Self>, wanted: WantedTurn) -> Result<Turn> {
        let WantedTurn { turn, rx } = wanted;
        match rx.recv() {
            Ok(TurnOutcome::Go(sent)) => Ok(Turn {
                seam: self.clone(),
                turn,
                go_delay_ns: crate::seam::mono_ns().saturating_sub(sent),
            }),
            Ok(TurnOutcome::Dropped(reason)) => Err(Error::IterationDropped(reason)),
            Ok(TurnOutcome::Unavailable(why)) => Err(Error::Unavailable(why)),
            Err(_) if self.is_closed() => Err(self.gone()),
            Err(_) => Err(Error::IterationDropped(
                "the iteration was given up before it ran: its client left".into(),
            )),
        }
    }

    /// Whether another job's queued iteration ranks ahead of `job` (false when
    /// the supervisor does not answer in time).
    pub fn outranked(&self, job: JobId) -> bool {
        let now = Instant::now();
        let cached = lock(&self.outranked).get(&job).copied();
        if let Some(ranking) = cached {
            let age = now.saturating_duration_since(ranking.at);
            if age < self.ranking_fresh {
                return ranking.outranked;
            }
            if age < self.ranking_usable {
                if !ranking.refreshing {
                    self.refresh_ranking(job);
                }
                return ranking.outranked;
            }
        }
        let yes = self
            .query(msg::query::What::Outranked(job.0))
            .is_some_and(|a| a.yes);
        self.remember_ranking(job, yes);
        yes
    }

    /// Asks for `job`'s ranking without waiting: the answer updates the cache.
    fn refresh_ranking(&self, job: JobId) {
        if self.is_closed() || self.is_orphaned() {
            return;
        }
        if let Some(ranking) = lock(&self.outranked).get_mut(&job) {
            ranking.refreshing = true;
        }
        let id = self.next_id();
        lock(&self.refreshes).insert(id, job);
        self.send(to_supervisor::Msg::Query(msg::Query {
            id,
            what: Some(msg::query::What::Outranked(job.0)),
        }));
    }

    fn remember_ranking(&self, job: JobId, outranked: bool) {
        let now = Instant::now();
        let mut cache = lock(&self.outranked);
        if cache.len() > 10_000 {
            cache.retain(|_, r| now.saturating_duration_since(r.at) < self.ranking_usable);
        }
        cache.insert(
            job,
            Ranking {
                at: now,
                outranked,
                refreshing: false,
            },
        );
    }

    /// With fixed (GPU) lanes, the lane for a new graph.
    pub fn lane_for_new_graph(&self) -> Option<LaneId> {
        self.query(msg::query::What::LaneForNewGraph(true))
            .and_then(|a| a.lane)
            .map(LaneId)
    }

    fn query(&self, what: msg::query::What) -> Option<msg::Answer> {
        // With no supervisor the executor decides alone at once.
        if self.is_closed() || self.is_orphaned() {
            return None;
        }
        let id = self.next_id();
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.answers).insert(id, tx);
        self.send(to_supervisor::Msg::Query(msg::Query {
            id,
            what: Some(what),
        }));
        let answer = rx.recv_timeout(QUERY_TIMEOUT).ok();
        lock(&self.answers).remove(&id);
        answer
    }

    /// A job opens; the supervisor refuses one beyond the tenant's max-jobs.
    pub async fn open_job(&self, job: JobId, name: &str, eager: bool) -> Result<()> {
        if self.is_closed() {
            return Err(self.gone());
        }
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        lock(&self.openings).insert(id, tx);
        self.send(to_supervisor::Msg::OpenJob(msg::OpenJob {
            job: job.0,
            name: name.to_string(),
            eager,
            id,
        }));
        let opened = rx.await.map_err(|_| self.gone())?;
        match opened.error {
            None => Ok(()),
            Some(err) => Err(Error::Tensorflow(TfError::new(err.code, err.message))),
        }
    }

    /// Memory admission by the supervisor; the lane granted.
    pub async fn admit(
        &self,
        job: JobId,
        need: MemoryNeed,
        pinned: Option<LaneId>,
        hints: &Hints,
    ) -> Result<LaneId> {
        if self.is_closed() {
            return Err(self.gone());
        }
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        lock(&self.admissions).insert(id, tx);
        self.send(to_supervisor::Msg::Admit(msg::Admit {
            id,
            job: job.0,
            persistent: need.persistent,
            ephemeral: need.ephemeral,
            pinned_lane: pinned.map(|l| l.0),
            hints: Some(hints_to_msg(hints)),
            held: false,
        }));
        let admitted = rx.await.map_err(|_| self.gone())?;
        match admitted.outcome {
            Some(msg::admitted::Outcome::Lane(lane)) => Ok(LaneId(lane)),
            Some(msg::admitted::Outcome::Error(err)) => {
                Err(Error::Tensorflow(TfError::new(err.code, err.message)))
            }
            None => Err(Error::Internal(
                "the supervisor's admission answer was empty".into(),
            )),
        }
    }
}

/// A main iteration asked for, not yet given its go-ahead.
pub struct WantedTurn {
    pub turn: u64,
    rx: mpsc::Receiver<TurnOutcome>,
}

/// A main iteration in progress; dropping it tells the supervisor it ended.
pub struct Turn {
    seam: Arc<SeamClient>,
    turn: u64,
    go_delay_ns: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.seam.send(to_supervisor::Msg::Done(msg::Done {
            turn: self.turn,
            go_delay_ns: self.go_delay_ns,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in supervisor: answers each Outranked query with the next
    /// value `answers` yields, and counts the queries.
    fn supervisor(
        stream: UnixStream,
        answers: mpsc::Receiver<bool>,
        queries: Arc<AtomicU64>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut reader = stream.try_clone().unwrap();
            let mut writer = stream;
            while let Ok(Some(frame)) = read_frame::<_, msg::ToSupervisor>(&mut reader) {
                if let Some(to_supervisor::Msg::Query(query)) = frame.msg {
                    queries.fetch_add(1, Ordering::SeqCst);
                    let Ok(yes) = answers.recv() else { return };
                    let answer = msg::ToExecutor {
                        msg: Some(to_executor::Msg::Answer(msg::Answer {
                            id: query.id,
                            yes,
                            lane: None,
                        })),
                    };
                    write_frame(&mut writer, &answer).unwrap();
                }
            }
        })
    }

    fn age(client: &SeamClient, job: JobId, by: Duration) {
        let mut cache = lock(&client.outranked);
        let ranking = cache.get_mut(&job).unwrap();
        ranking.at -= by;
    }

    #[test]
    fn a_stale_ranking_decides_while_a_newer_one_is_fetched() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let ending = ours.try_clone().unwrap();
        let (answer, answers) = mpsc::channel();
        let queries = Arc::new(AtomicU64::new(0));
        let fake = supervisor(theirs, answers, queries.clone());
        // Answers are fresh 20 s and usable 40 s: the test may be slow (and
        // the clock is aged back by those, so they must stay short of uptime).
        let fresh = Duration::from_secs(20);
        let usable = 2 * fresh;
        let client =
            SeamClient::start_with(ours, WhenOrphaned::Exit(Box::new(|| {})), fresh, usable)
                .unwrap();
        let job = JobId(7);

        // No answer yet: asked and waited for.
        answer.send(false).unwrap();
        assert!(!client.outranked(job));
        assert_eq!(queries.load(Ordering::SeqCst), 1);
        // Fresh: from the cache.
        assert!(!client.outranked(job));
        assert_eq!(queries.load(Ordering::SeqCst), 1);

        // Stale: the old answer decides at once (the supervisor has not
        // answered yet), and one newer one is asked for.
        age(&client, job, fresh);
        assert!(!client.outranked(job));
        assert!(!client.outranked(job));
        answer.send(true).unwrap();
        let waited = Instant::now();
        while !lock(&client.outranked)[&job].outranked {
            assert!(
                waited.elapsed() < Duration::from_secs(10),
                "the refresh never came"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(client.outranked(job));
        assert_eq!(
            queries.load(Ordering::SeqCst),
            2,
            "one refresh for two stale reads"
        );

        // Too old to use: asked and waited for again.
        age(&client, job, usable);
        answer.send(false).unwrap();
        assert!(!client.outranked(job));
        assert_eq!(queries.load(Ordering::SeqCst), 3);

        // Both readers see the end.
        ending.shutdown(std::net::Shutdown::Both).unwrap();
        drop(answer);
        fake.join().unwrap();
    }
}
