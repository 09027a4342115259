//! The adversarial seam harness: a rogue executor, speaking raw frames to a
//! real [`Link`] in front of a real scheduler core, next to a well-behaved
//! tenant's executor. Whatever the rogue sends, stops reading or stops
//! running, the supervisor stays up and the other tenant's iterations run.
//!
//! Nothing here asserts a timing: waits are bounded only so that a
//! regression fails instead of hanging, far beyond what the behaviour needs.

use std::io::Write;
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::runtime::admission::Admission;
use crate::sched::lanes::LaneManager;
use crate::sched::policy::by_name;
use crate::sched::{Hints, SchedConfig};
use crate::seam::frame::write_frame;
use crate::tenant::limits::Limits;

/// Longest any wait here may take before the test fails (never reached
/// when the behaviour holds).
const GIVE_UP: Duration = Duration::from_secs(60);

const ROGUE_JOBS: Range<u64> = (1 << 32)..(2 << 32);
const GOOD_JOBS: Range<u64> = (2 << 32)..(3 << 32);

struct Node {
    runtime: tokio::runtime::Runtime,
    core: Executor,
    admission: Option<Admission>,
}

impl Node {
    fn new(admission_capacity: Option<u64>) -> Node {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let core = Executor::new(by_name("fair").unwrap(), SchedConfig::default());
        let admission = admission_capacity
            .map(|c| Admission::new(LaneManager::new(c), Duration::from_secs(5), core.clone()));
        Node {
            runtime,
            core,
            admission,
        }
    }

    /// A link to an executor at the other end of the returned socket; its
    /// process is `process` (a child standing in for the executor).
    fn link(
        &self,
        tenant: &str,
        job_ids: Range<u64>,
        silence_limit: Option<Duration>,
        process: Arc<ExecutorProcess>,
    ) -> (Arc<Link>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (link, _hello) = Link::start(
            ours,
            self.core.clone(),
            self.admission.clone(),
            self.runtime.handle().clone(),
            LinkSpec {
                label: format!("{tenant}:test"),
                owner: Tenant::named(tenant),
                hold_limit: None, // what frees the lanes here is not the hold limit
                job_ids,
                silence_limit,
                process,
            },
        )
        .unwrap();
        (link, theirs)
    }
}

/// A process to stand in for an executor: what the supervisor signals.
struct StandIn(std::process::Child);

impl StandIn {
    fn start() -> StandIn {
        StandIn(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap(),
        )
    }
    fn process(&self) -> Arc<ExecutorProcess> {
        Arc::new(ExecutorProcess::open(self.0.id()))
    }
    /// How it ended, once it has (None: it still runs after `GIVE_UP`).
    fn ended(&mut self) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + GIVE_UP;
        while Instant::now() < until {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send(to: &mut UnixStream, message: to_supervisor::Msg) {
    write_frame(to, &msg::ToSupervisor { msg: Some(message) }).unwrap();
}

fn next(from: &mut UnixStream) -> to_executor::Msg {
    from.set_read_timeout(Some(GIVE_UP)).unwrap();
    read_frame::<_, msg::ToExecutor>(from)
        .unwrap()
        .and_then(|m| m.msg)
        .expect("a message from the supervisor")
}

fn hello(to: &mut UnixStream) {
    send(
        to,
        to_supervisor::Msg::Hello(msg::Hello {
            answers_pings: true,
            ..Default::default()
        }),
    );
}

fn open(to: &mut UnixStream, job: u64, id: u64) {
    send(
        to,
        to_supervisor::Msg::OpenJob(msg::OpenJob {
            job,
            name: format!("job{job}"),
            eager: false,
            id,
        }),
    );
}

fn want(to: &mut UnixStream, job: u64, turn: u64) {
    send(
        to,
        to_supervisor::Msg::Want(msg::Want {
            turn,
            job,
            deadline_ms: 0,
            running: false,
        }),
    );
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let limit = Instant::now() + GIVE_UP;
    while !done() {
        assert!(Instant::now() < limit, "gave up waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A well-behaved executor of another tenant: opens a job on lane 0 and
/// runs `turns` main iterations, answering pings; returns how many ran.
fn good_tenant(node: &Node, turns: u64) -> std::thread::JoinHandle<u64> {
    let stand_in = StandIn::start();
    let (_link, mut seam) = node.link(
        "good",
        GOOD_JOBS,
        Some(Duration::from_millis(200)),
        stand_in.process(),
    );
    std::thread::spawn(move || {
        let _keep = (stand_in, _link);
        let job = GOOD_JOBS.start + 1;
        hello(&mut seam);
        open(&mut seam, job, 1);
        match next(&mut seam) {
            to_executor::Msg::Opened(o) => assert_eq!(o.error, None),
            other => panic!("{other:?}"),
        }
        send(
            &mut seam,
            to_supervisor::Msg::AddJob(msg::AddJob {
                job,
                lane: 0,
                hints: None,
            }),
        );
        let mut ran = 0;
        for turn in 1..=turns {
            want(&mut seam, job, turn);
            loop {
                match next(&mut seam) {
                    to_executor::Msg::Go(go) => {
                        assert_eq!(go.turn, turn);
                        send(
                            &mut seam,
                            to_supervisor::Msg::Done(msg::Done {
                                turn,
                                go_delay_ns: 0,
                            }),
                        );
                        ran += 1;
                        break;
                    }
                    to_executor::Msg::Ping(ping) => send(
                        &mut seam,
                        to_supervisor::Msg::Pong(msg::Pong { id: ping.id }),
                    ),
                    other => panic!("{other:?}"),
                }
            }
        }
        ran
    })
}

/// The rogue opens a job on lane 0 and takes a turn (its Go arrives), so
/// that it holds the lane the good tenant needs.
fn rogue_holding_lane0(
    node: &Node,
    silence: Option<Duration>,
    process: Arc<ExecutorProcess>,
) -> (Arc<Link>, UnixStream) {
    let (link, mut seam) = node.link("rogue", ROGUE_JOBS, silence, process);
    hello(&mut seam);
    let job = ROGUE_JOBS.start + 1;
    open(&mut seam, job, 1);
    assert!(matches!(next(&mut seam), to_executor::Msg::Opened(o) if o.error.is_none()));
    // It names lane 9: with no memory admission every job is on lane 0.
    send(
        &mut seam,
        to_supervisor::Msg::AddJob(msg::AddJob {
            job,
            lane: 9,
            hints: None,
        }),
    );
    want(&mut seam, job, 1);
    assert!(matches!(next(&mut seam), to_executor::Msg::Go(_)));
    assert!(node
        .core
        .job_status(JobId(job))
        .is_some_and(|s| s.lane == LaneId(0)));
    (link, seam)
}

#[test]
fn an_executor_that_stops_reading_loses_its_lane_after_the_silence_limit() {
    let node = Node::new(None);
    let stand_in = StandIn::start();
    // It holds lane 0 and then neither reads nor answers: no Done, no Pong.
    let (link, _seam) =
        rogue_holding_lane0(&node, Some(Duration::from_millis(200)), stand_in.process());
    let good = good_tenant(&node, 20);
    assert_eq!(
        good.join().unwrap(),
        20,
        "the other tenant's iterations all ran"
    );
    assert_eq!(link.standing(), Standing::Silent);
    assert!(!link.is_dead(), "silence alone does not end an executor");
}

#[test]
fn a_stopped_executor_loses_its_lane_at_once_and_gets_its_turns_back_when_it_continues() {
    let node = Node::new(None);
    let stand_in = StandIn::start();
    // No silence limit: only the stop (as its parent sees it) frees the lane.
    let (link, mut seam) = rogue_holding_lane0(&node, None, stand_in.process());
    link.stopped();
    let good = good_tenant(&node, 10);
    assert_eq!(good.join().unwrap(), 10);
    // Its next turn waits aside while it is stopped ...
    let job = ROGUE_JOBS.start + 1;
    want(&mut seam, job, 2);
    let queued_again = std::thread::spawn(move || (next(&mut seam), seam));
    until("the rogue's turn is set aside", || {
        !lock(&link.lanes).parked.is_empty()
    });
    // ... and gets its go-ahead once it continues.
    link.continued();
    let (go, _seam) = queued_again.join().unwrap();
    assert!(
        matches!(go, to_executor::Msg::Go(g) if g.turn == 2),
        "{go:?}"
    );
    assert_eq!(link.standing(), Standing::Serving);
}

#[test]
fn stopping_and_continuing_in_a_loop_does_not_stall_the_other_tenant() {
    let node = Node::new(None);
    let stand_in = StandIn::start();
    let (link, _seam) = rogue_holding_lane0(&node, None, stand_in.process());
    let flapping = {
        let link = link.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                link.stopped();
                std::thread::sleep(Duration::from_millis(1));
                link.continued();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    link.stopped(); // its first turn's lane, held without a Done
    let good = good_tenant(&node, 50);
    assert_eq!(good.join().unwrap(), 50);
    flapping.join().unwrap();
}

#[test]
fn an_executor_that_floods_without_reading_is_ended_and_blocks_nobody() {
    let node = Node::new(None);
    let mut stand_in = StandIn::start();
    let (link, mut seam) = node.link("rogue", ROGUE_JOBS, None, stand_in.process());
    hello(&mut seam);
    // Queries are answered at once; it reads none of the answers.
    let flood = std::thread::spawn(move || {
        for id in 0.. {
            let query = msg::Query {
                id,
                what: Some(msg::query::What::LaneForNewGraph(true)),
            };
            let frame = msg::ToSupervisor {
                msg: Some(to_supervisor::Msg::Query(query)),
            };
            if write_frame(&mut seam, &frame).is_err() {
                return id;
            }
        }
        unreachable!()
    });
    let status = stand_in.ended().expect("the flooding executor was ended");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(flood.join().unwrap() as usize >= OUTBOX_CAPACITY);
    until("the link dies", || link.is_dead());
    assert_eq!(good_tenant(&node, 5).join().unwrap(), 5);
}

#[test]
fn malformed_and_oversized_frames_end_only_that_seam() {
    let node = Node::new(None);
    for garbage in [
        vec![0xff, 0xff, 0xff, 0xff],             // beyond the largest frame
        vec![0x00, 0x00, 0x00, 0x03, 0x01, 0x02], // near the limit, then nothing
        vec![5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff], // not protobuf
        vec![2, 0, 0, 0, 0x0a, 0x7f],             // a field longer than the frame
    ] {
        let stand_in = StandIn::start();
        let (link, mut seam) = node.link("rogue", ROGUE_JOBS, None, stand_in.process());
        seam.write_all(&garbage).unwrap();
        drop(seam); // so a frame it promised but never sent ends too
        until("the link dies", || link.is_dead());
    }
    assert_eq!(good_tenant(&node, 3).join().unwrap(), 3);
}

#[test]
fn jobs_it_never_opened_and_lanes_it_was_never_given_are_refused() {
    let node = Node::new(Some(1 << 30));
    let stand_in = StandIn::start();
    let (link, mut seam) = node.link("rogue", ROGUE_JOBS, None, stand_in.process());
    hello(&mut seam);
    let never_opened = ROGUE_JOBS.start + 7;
    // A job in its range it never opened: no lane, no turn, no memory.
    send(
        &mut seam,
        to_supervisor::Msg::AddJob(msg::AddJob {
            job: never_opened,
            lane: 3,
            hints: None,
        }),
    );
    want(&mut seam, never_opened, 1);
    match next(&mut seam) {
        to_executor::Msg::Dropped(d) => assert!(d.reason.contains("not opened"), "{}", d.reason),
        other => panic!("{other:?}"),
    }
    send(
        &mut seam,
        to_supervisor::Msg::Admit(msg::Admit {
            id: 5,
            job: never_opened,
            persistent: 1,
            ephemeral: 1,
            ..Default::default()
        }),
    );
    match next(&mut seam) {
        to_executor::Msg::Admitted(a) => assert!(
            matches!(&a.outcome, Some(msg::admitted::Outcome::Error(e)) if e.message.contains("not opened")),
            "{a:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(node.core.job_status(JobId(never_opened)).is_none());
    // A job it opened, joined on a lane no admission gave it.
    let opened = ROGUE_JOBS.start + 8;
    open(&mut seam, opened, 2);
    assert!(matches!(next(&mut seam), to_executor::Msg::Opened(o) if o.error.is_none()));
    send(
        &mut seam,
        to_supervisor::Msg::AddJob(msg::AddJob {
            job: opened,
            lane: 3,
            hints: None,
        }),
    );
    until("the AddJob is refused", || link.refused_messages() >= 4);
    assert!(
        node.core.job_status(JobId(opened)).is_none(),
        "it did not join the scheduler"
    );
    assert!(
        node.admission.as_ref().unwrap().lanes().is_empty(),
        "no lane was made for it"
    );
    // Cancels of turns it never wanted are not kept.
    for turn in 100..10_100 {
        send(&mut seam, to_supervisor::Msg::Cancel(msg::Cancel { turn }));
    }
    // A name past the bound.
    send(
        &mut seam,
        to_supervisor::Msg::OpenJob(msg::OpenJob {
            job: opened + 1,
            name: "x".repeat(MAX_JOB_NAME + 1),
            eager: false,
            id: 3,
        }),
    );
    match next(&mut seam) {
        to_executor::Msg::Opened(o) => {
            assert_eq!(o.error.expect("refused").code, Code::InvalidArgument as i32)
        }
        other => panic!("{other:?}"),
    }
    assert!(lock(&link.wanted).cancelled.is_empty());
    assert!(!link.is_dead(), "refusals do not end it");
}

#[test]
fn wanted_turns_are_bounded() {
    let node = Node::new(None);
    let stand_in = StandIn::start();
    let (link, mut seam) = rogue_holding_lane0(&node, None, stand_in.process());
    let job = ROGUE_JOBS.start + 1;
    // Its first turn holds lane 0, so every later one queues.
    for turn in 2..(MAX_WANTED_TURNS as u64 + 10) {
        want(&mut seam, job, turn);
    }
    let mut reader = seam.try_clone().unwrap();
    match next(&mut reader) {
        to_executor::Msg::Dropped(d) => assert!(d.reason.contains("queued"), "{}", d.reason),
        other => panic!("{other:?}"),
    }
    assert!(lock(&link.wanted).turns.len() <= MAX_WANTED_TURNS);
    link.die();
}

#[test]
fn an_executor_that_lies_about_priority_is_capped_in_the_admission_rank() {
    let core = Executor::new(by_name("priority").unwrap(), SchedConfig::default());
    core.set_limits(
        "rogue",
        &Limits {
            max_priority: Some(0),
            ..Limits::default()
        },
    );
    let rank = |tenant: &str, job: u64, priority: i32| {
        let job = JobId(job);
        let _ = core.open_job(
            job,
            "j",
            crate::runtime::timeline::JobKind::Graph,
            Some(&Tenant::named(tenant)),
        );
        let key = core.rank_new(
            job,
            &Hints {
                priority,
                ..Hints::default()
            },
        );
        (key.primary, key.secondary)
    };
    let rogue = ROGUE_JOBS.start + 1;
    assert_eq!(
        rank("rogue", rogue, 1000),
        rank("rogue", rogue, 0),
        "ranked as its max-priority"
    );
    let other = GOOD_JOBS.start + 1;
    assert_ne!(
        rank("good", other, 1000),
        rank("good", other, 0),
        "an uncapped tenant's priority counts"
    );
}

#[test]
fn an_iteration_interrupted_by_a_stop_holds_a_lane_again_once_the_executor_continues() {
    let node = Node::new(None);
    let stand_in = StandIn::start();
    let (link, mut seam) = rogue_holding_lane0(&node, None, stand_in.process());
    let job = JobId(ROGUE_JOBS.start + 1);
    link.stopped();
    until("the lane is free", || {
        node.core.job_status(job).is_some_and(|s| s.running == 0)
    });
    assert_eq!(good_tenant(&node, 3).join().unwrap(), 3);
    // It goes on computing the moment it continues: it is queued again, and
    // holds a lane, without a second Go, until its Done.
    link.continued();
    until("the interrupted iteration holds a lane", || {
        node.core.job_status(job).is_some_and(|s| s.running == 1)
    });
    send(
        &mut seam,
        to_supervisor::Msg::Done(msg::Done {
            turn: 1,
            go_delay_ns: 0,
        }),
    );
    until("its Done ends it", || {
        node.core.job_status(job).is_some_and(|s| s.running == 0)
    });
    seam.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let unread = std::io::Read::read(&mut seam, &mut byte);
    assert!(
        matches!(&unread, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing was sent to it (no second Go): {unread:?}"
    );
    assert!(lock(&link.wanted).turns.is_empty());
}

#[test]
fn releases_after_a_job_left_are_ignored_not_refused() {
    let node = Node::new(Some(1 << 30));
    let stand_in = StandIn::start();
    let (link, mut seam) = node.link("honest", ROGUE_JOBS, None, stand_in.process());
    hello(&mut seam);
    let job = ROGUE_JOBS.start + 1;
    open(&mut seam, job, 1);
    assert!(matches!(next(&mut seam), to_executor::Msg::Opened(o) if o.error.is_none()));
    // A closing job's messages: its removal, then what it still lets go of.
    send(
        &mut seam,
        to_supervisor::Msg::RemoveJob(msg::RemoveJob {
            job,
            end: String::new(),
        }),
    );
    send(&mut seam, to_supervisor::Msg::Release(msg::Release { job }));
    send(
        &mut seam,
        to_supervisor::Msg::Withdraw(msg::Withdraw { job }),
    );
    // Then something that is refused, to know the ones before were handled.
    want(&mut seam, job, 9);
    assert!(matches!(next(&mut seam), to_executor::Msg::Dropped(d) if d.turn == 9));
    assert_eq!(
        link.refused_messages(),
        1,
        "only the turn for a job that left is refused"
    );
}
