//! The core driven directly, in virtual time.

use super::policy::by_name;
use super::*;

const MS: Nanos = 1_000_000;
const L: LaneId = LaneId(0);

fn sched(policy: &str) -> Scheduler<&'static str> {
    Scheduler::new(
        by_name(policy).unwrap(),
        SchedConfig {
            lane_concurrency: 1,
            anticipation: 2 * MS,
            ..SchedConfig::default()
        },
    )
}

fn hints(seconds: Option<f64>, priority: i32) -> Hints {
    Hints {
        expected_seconds: seconds,
        priority,
        ..Default::default()
    }
}

/// Runs the dispatched iteration for `cost` and returns which job it was.
fn run_next(s: &mut Scheduler<&'static str>, now: &mut Nanos, cost: Nanos) -> Option<&'static str> {
    match s.next(L, *now) {
        Decision::Run(d) => {
            *now += cost;
            s.finish(d.job, d.lane, Some(cost), *now);
            Some(d.work)
        }
        _ => None,
    }
}

#[test]
fn fifo_blocks_later_jobs_while_the_first_lives() {
    let mut s = sched("fifo");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 1).unwrap();
    s.submit(JobId(1), "a", 2).unwrap();
    let mut now = 3;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("a"));
    // Job 1 has nothing queued, but it lives and has started: job 2 waits.
    s.submit(JobId(2), "b", now).unwrap();
    assert!(matches!(s.next(L, now + 100 * MS), Decision::Idle));
    s.remove_job(JobId(1)).unwrap();
    assert_eq!(run_next(&mut s, &mut now, MS), Some("b"));
}

#[test]
fn fifo_does_not_wait_for_an_idle_session_that_never_started() {
    let mut s = sched("fifo");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 1).unwrap();
    s.submit(JobId(2), "b", 2).unwrap();
    let mut now = 3;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("b"));
    // Once job 1 has work, it is first again: it was admitted first.
    s.submit(JobId(1), "a", now).unwrap();
    s.submit(JobId(2), "b", now).unwrap();
    assert_eq!(run_next(&mut s, &mut now, MS), Some("a"));
}

#[test]
fn srtf_switches_to_a_shorter_newcomer_at_the_next_boundary() {
    let mut s = sched("srtf");
    s.add_job(JobId(1), L, hints(Some(10.0), 0), 0).unwrap();
    let mut now = 0;
    s.submit(JobId(1), "long", now).unwrap();
    // The long job's iteration is running when a short job arrives.
    let Decision::Run(d) = s.next(L, now) else {
        panic!("long job runs")
    };
    s.add_job(JobId(2), L, hints(Some(1.0), 0), now + MS)
        .unwrap();
    s.submit(JobId(2), "short", now + MS).unwrap();
    s.submit(JobId(1), "long", now + MS).unwrap();
    // Nothing preempts mid-iteration.
    assert!(matches!(s.next(L, now + MS), Decision::Idle));
    now += 5 * MS;
    s.finish(d.job, d.lane, Some(5 * MS), now);
    assert_eq!(run_next(&mut s, &mut now, MS), Some("short"));
}

#[test]
fn srtf_waits_for_the_best_job_between_its_iterations_but_not_forever() {
    let mut s = sched("srtf");
    s.add_job(JobId(1), L, hints(Some(1.0), 0), 0).unwrap();
    s.add_job(JobId(2), L, hints(Some(100.0), 0), 0).unwrap();
    let mut now = 0;
    s.submit(JobId(1), "short", now).unwrap();
    assert_eq!(run_next(&mut s, &mut now, MS), Some("short"));
    s.submit(JobId(2), "long", now).unwrap();
    // The short job is between iterations: hold the lane for it.
    match s.next(L, now + 100) {
        Decision::WaitUntil(t) => assert_eq!(t, now + 2 * MS),
        other => panic!("expected a wait, got {other:?}"),
    }
    s.submit(JobId(1), "short", now + 200).unwrap();
    now += 200;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("short"));
    // The short job went quiet: after the window the long one runs.
    now += 3 * MS;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("long"));
}

#[test]
fn srtf_estimates_from_iteration_hints_and_measured_time() {
    let mut s = sched("srtf");
    let h = |n| Hints {
        expected_iterations: Some(n),
        ..Default::default()
    };
    s.add_job(JobId(1), L, h(1000), 0).unwrap();
    s.add_job(JobId(2), L, h(10), 0).unwrap();
    let mut now = 0;
    for (job, name) in [(1, "a"), (2, "b")] {
        s.submit(JobId(job), name, now).unwrap();
    }
    // Neither has a measurement yet: both count as 0 remaining, arrival order.
    assert_eq!(run_next(&mut s, &mut now, MS), Some("a"));
    now += 10 * MS;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("b"));
    assert_eq!(s.status(JobId(2)).unwrap().remaining, Some(9 * MS));
    // A hinted newcomer is probed at the next boundary, ahead of job 2.
    s.add_job(JobId(3), L, h(5000), now).unwrap();
    assert_eq!(s.status(JobId(3)).unwrap().remaining, Some(0));
    assert_eq!(s.status(JobId(1)).unwrap().remaining, Some(999 * MS));
    s.submit(JobId(1), "a", now).unwrap();
    s.submit(JobId(2), "b", now).unwrap();
    s.submit(JobId(3), "c", now).unwrap();
    assert_eq!(run_next(&mut s, &mut now, MS), Some("c"));
    assert_eq!(run_next(&mut s, &mut now, MS), Some("b"));
}

#[test]
fn fair_equalises_attained_time_and_newcomers_start_at_the_minimum() {
    let mut s = sched("fair");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 0).unwrap();
    let mut now = 0;
    let mut order = Vec::new();
    for _ in 0..6 {
        s.submit(JobId(1), "a", now).unwrap();
        s.submit(JobId(2), "b", now).unwrap();
        order.push(run_next(&mut s, &mut now, 3 * MS).unwrap());
        order.push(run_next(&mut s, &mut now, 3 * MS).unwrap());
        s.drain_queued(|_| false);
    }
    let a = order.iter().filter(|w| **w == "a").count();
    assert_eq!(a, 6, "{order:?}");
    // A newcomer does not get to catch up on 18 ms of service alone.
    s.add_job(JobId(3), L, Hints::default(), now).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        for (j, w) in [(1, "a"), (2, "b"), (3, "c")] {
            s.submit(JobId(j), w, now).unwrap();
        }
        for _ in 0..3 {
            got.push(run_next(&mut s, &mut now, 3 * MS).unwrap());
        }
    }
    assert_eq!(got.iter().filter(|w| **w == "c").count(), 3, "{got:?}");
}

#[test]
fn las_favours_the_newcomer_until_it_catches_up() {
    let mut s = sched("las");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    let mut now = 0;
    for _ in 0..5 {
        s.submit(JobId(1), "a", now).unwrap();
        run_next(&mut s, &mut now, MS);
    }
    s.add_job(JobId(2), L, Hints::default(), now).unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        s.submit(JobId(1), "a", now).unwrap();
        s.submit(JobId(2), "b", now).unwrap();
        got.push(run_next(&mut s, &mut now, MS).unwrap());
        s.drain_queued(|_| false);
    }
    assert_eq!(got, ["b"; 5]);
}

#[test]
fn priority_runs_inference_before_training() {
    let mut s = sched("priority");
    s.add_job(JobId(1), L, hints(None, 0), 0).unwrap();
    s.add_job(JobId(2), L, hints(None, 10), 5).unwrap();
    s.submit(JobId(1), "train", 6).unwrap();
    s.submit(JobId(2), "infer", 7).unwrap();
    let mut now = 8;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("infer"));
    // Inference is momentarily idle: training is held only within the window.
    assert!(matches!(s.next(L, now), Decision::WaitUntil(_)));
    now += 3 * MS;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("train"));
}

#[test]
fn rr_takes_turns_and_pack_is_work_conserving() {
    let mut s = sched("rr");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 1).unwrap();
    let mut now = 2;
    let mut got = Vec::new();
    for _ in 0..3 {
        s.submit(JobId(1), "a", now).unwrap();
        s.submit(JobId(2), "b", now).unwrap();
        got.push(run_next(&mut s, &mut now, MS).unwrap());
        got.push(run_next(&mut s, &mut now, 5 * MS).unwrap());
    }
    assert_eq!(got, ["a", "b", "a", "b", "a", "b"]);

    let mut p = sched("pack");
    p.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    p.add_job(JobId(2), L, Hints::default(), 1).unwrap();
    let mut now = 2;
    p.submit(JobId(1), "a", now).unwrap();
    assert_eq!(run_next(&mut p, &mut now, MS), Some("a"));
    // Job 1 is between iterations; pack does not wait for it.
    p.submit(JobId(2), "b", now).unwrap();
    assert_eq!(run_next(&mut p, &mut now, MS), Some("b"));
}

#[test]
fn lane_concurrency_limits_iterations_in_flight() {
    let mut s: Scheduler<u32> = Scheduler::new(
        by_name("pack").unwrap(),
        SchedConfig {
            lane_concurrency: 2,
            anticipation: 0,
            ..SchedConfig::default()
        },
    );
    for j in 1..=3 {
        s.add_job(JobId(j), L, Hints::default(), j).unwrap();
        s.submit(JobId(j), j as u32, 10).unwrap();
    }
    let Decision::Run(a) = s.next(L, 11) else {
        panic!()
    };
    let Decision::Run(b) = s.next(L, 11) else {
        panic!()
    };
    assert_eq!((a.work, b.work), (1, 2));
    assert!(matches!(s.next(L, 11), Decision::Idle));
    s.finish(a.job, a.lane, Some(5), 16);
    let Decision::Run(c) = s.next(L, 16) else {
        panic!()
    };
    assert_eq!(c.work, 3);
}

#[test]
fn removed_jobs_return_their_queue_and_keep_the_slot_until_finish() {
    let mut s = sched("pack");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 0).unwrap();
    s.submit(JobId(1), "a1", 0).unwrap();
    s.submit(JobId(1), "a2", 0).unwrap();
    s.submit(JobId(2), "b", 0).unwrap();
    let Decision::Run(d) = s.next(L, 1) else {
        panic!()
    };
    assert_eq!(s.remove_job(JobId(1)).unwrap(), vec!["a2"]);
    // a1 still runs: the lane is full until it finishes.
    assert!(matches!(s.next(L, 2), Decision::Idle));
    s.finish(d.job, d.lane, Some(1), 3);
    assert!(matches!(
        s.next(L, 3),
        Decision::Run(Dispatch { work: "b", .. })
    ));
    assert_eq!(
        s.remove_job(JobId(1)),
        Err(SchedError::UnknownJob(JobId(1)))
    );
    assert_eq!(
        s.submit(JobId(9), "x", 0),
        Err(SchedError::UnknownJob(JobId(9)))
    );
}

#[test]
fn dropping_queued_work_and_switching_policy_keep_jobs() {
    let mut s = sched("fifo");
    s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
    s.add_job(JobId(2), L, Hints::default(), 1).unwrap();
    s.submit(JobId(1), "a", 2).unwrap();
    let mut now = 2;
    assert_eq!(run_next(&mut s, &mut now, MS), Some("a"));
    s.submit(JobId(1), "gone", now).unwrap();
    s.submit(JobId(2), "b", now).unwrap();
    assert_eq!(s.drain_queued(|w| *w != "gone"), vec!["gone"]);
    assert!(matches!(s.next(L, now), Decision::Idle));
    s.set_policy(by_name("pack").unwrap());
    assert_eq!(s.policy_name(), "pack");
    assert_eq!(run_next(&mut s, &mut now, MS), Some("b"));
}

#[test]
fn cheap_runs_count_as_service_and_yield_to_jobs_ranked_ahead() {
    let mut s = sched("fair");
    let (a, b) = (JobId(1), JobId(2));
    s.add_job(a, L, Hints::default(), 0).unwrap();
    s.add_job(b, L, Hints::default(), 0).unwrap();
    // Nothing queued: a run outside the scheduler overtakes no one, even for
    // a job not admitted yet.
    assert!(!s.outranked(a) && !s.outranked(JobId(9)));
    // a's cheap runs are service under fair; b, queued, is now ahead of it.
    s.charge_outside_run(a, 50 * MS);
    s.submit(b, "b", 0).unwrap();
    assert!(s.outranked(a), "a yields to b's queued iteration");
    assert!(!s.outranked(b), "b's own iteration does not hold b back");
    assert!(
        s.outranked(JobId(9)),
        "a newcomer would join some lane's order"
    );
    // The charge is service, not an iteration: srtf-style means stay clean.
    let status = s.status(a).unwrap();
    assert_eq!((status.attained, status.iterations), (0, 0));
    assert_eq!(status.service, 50 * MS, "service counts it");
    // Once b has had more service than a, a's runs go first again.
    let mut now = 0;
    assert_eq!(run_next(&mut s, &mut now, 60 * MS), Some("b"));
    s.submit(b, "b", now).unwrap();
    assert!(!s.outranked(a));
}

#[test]
fn work_counts_every_iteration_at_the_fastest_ones_time() {
    let mut s = sched("fifo");
    let a = JobId(1);
    s.add_job(a, L, Hints::default(), 0).unwrap();
    let mut now = 0;
    // Stretched by contention: 30 ms, then 10 ms alone, then 20 ms.
    for cost in [30 * MS, 10 * MS, 20 * MS] {
        s.submit(a, "a", now).unwrap();
        assert_eq!(run_next(&mut s, &mut now, cost), Some("a"));
    }
    s.charge_outside_run(a, 5 * MS);
    let view = s.jobs[&a].view(a);
    assert_eq!(view.attained, 65 * MS, "wall time of the runs");
    assert_eq!(
        view.work,
        35 * MS,
        "3 iterations at 10 ms, plus the cheap runs"
    );
    // Back-to-back iterations handed over at once count at their mean.
    s.submit(a, "a", now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!("a runs")
    };
    s.finish_repeated(d.job, 40 * MS, 8, now + 40 * MS);
    assert_eq!(s.jobs[&a].view(a).work, 11 * 5 * MS + 5 * MS);
}

#[test]
fn learned_bounds_the_wait_of_a_job_outranked_forever() {
    use crate::policy::aging::promotion_wait_bound;
    const ITER: Nanos = 10_000_000_000;
    // A job told nothing, and an endless stream of jobs each told it needs
    // a second (its one iteration takes ten): every newcomer outranks it,
    // whatever the node learns of lengths. Without the guard it would
    // never run again; with it, each gap between its iterations is within
    // the guard's bound plus one iteration of each job ahead of it.
    let mut s = sched("learned");
    let victim = JobId(1);
    s.add_job(victim, L, Hints::default(), 0).unwrap();
    let mut now: Nanos = 0;
    s.submit(victim, "victim", now).unwrap();
    let mut next_id = 2;
    let mut stream = JobId(next_id);
    s.add_job(stream, L, hints(Some(1.0), 0), now).unwrap();
    s.submit(stream, "stream", now).unwrap();
    // From its arrival: the first wait is bounded too.
    let (mut last_run, mut victim_runs, mut victim_service) = (Some(0), 0, 0);
    let mut worst_gap_over_bound = f64::MIN;
    while now < 12 * 3600 * 1_000_000_000 {
        let Decision::Run(d) = s.next(L, now) else {
            panic!("work is always queued")
        };
        let started = now;
        now += ITER;
        s.finish(d.job, d.lane, Some(ITER), now);
        if d.job == victim {
            if let Some(last) = last_run {
                // Service since its last promotion is at most all of it.
                let bound = promotion_wait_bound(victim_service) + 2 * ITER;
                let gap = started - last;
                worst_gap_over_bound = worst_gap_over_bound.max(gap as f64 / bound as f64);
                assert!(gap <= bound, "waited {gap} ns, bound {bound} ns");
            }
            victim_runs += 1;
            victim_service += ITER;
            last_run = Some(now);
            s.submit(victim, "victim", now).unwrap();
        } else {
            // The stream job is done; the next one arrives at once.
            s.remove_job(stream).unwrap();
            next_id += 1;
            stream = JobId(next_id);
            s.add_job(stream, L, hints(Some(1.0), 0), now).unwrap();
            s.submit(stream, "stream", now).unwrap();
        }
    }
    // 12 hours, a 2.56-hour floor: it ran at least four times.
    assert!(victim_runs >= 4, "the victim ran {victim_runs} times");
    assert!(worst_gap_over_bound > 0.5, "the bound is not loose: {worst_gap_over_bound}");
}
