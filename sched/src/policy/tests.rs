//! Data-driven: given jobs, which one does each policy rank first?

use super::*;

fn job(
    id: u64,
    arrival: Nanos,
    attained: Nanos,
    iterations: u64,
    priority: i32,
    remaining: Option<Nanos>,
) -> JobView {
    JobView {
        id,
        arrival,
        attained,
        fair_attained: attained,
        work: attained,
        iterations,
        priority,
        remaining,
        waited: 0,
        learned: None,
        sibling_work: 0,
    }
}

fn order(policy: &str, jobs: &[JobView]) -> Vec<u64> {
    let p = by_name(policy).unwrap();
    let mut sorted = jobs.to_vec();
    sorted.sort_by(|a, b| p.compare(a, b));
    sorted.iter().map(|j| j.id).collect()
}

#[test]
fn each_policy_orders_jobs_by_its_rule() {
    // id, arrival, attained, iterations, priority, remaining
    let jobs = [
        job(1, 0, 900, 90, 0, Some(5_000)),
        job(2, 10, 300, 10, 5, Some(100)),
        job(3, 20, 50, 50, 5, None),
        job(4, 30, 0, 0, -1, Some(10_000)),
    ];
    let cases: &[(&str, [u64; 4])] = &[
        ("fifo", [1, 2, 3, 4]),
        ("pack", [1, 2, 3, 4]),
        ("srtf", [2, 1, 4, 3]),
        ("las", [4, 3, 2, 1]),
        // All below the first threshold: one queue, arrival order.
        ("dlas", [1, 2, 3, 4]),
        ("fair", [4, 3, 2, 1]),
        ("rr", [4, 2, 3, 1]),
        ("priority", [3, 2, 1, 4]),
    ];
    for (policy, expected) in cases {
        assert_eq!(order(policy, &jobs), expected, "{policy}");
    }
}

#[test]
fn ties_break_by_arrival() {
    let jobs = [
        job(7, 5, 0, 0, 0, None),
        job(3, 5, 0, 0, 0, None),
        job(9, 1, 0, 0, 0, None),
    ];
    for policy in NAMES {
        assert_eq!(order(policy, &jobs), [9, 3, 7], "{policy}");
    }
}

const MINUTE: Nanos = 60_000_000_000;

#[test]
fn srtf_without_estimates_is_gittins_after_hinted_jobs() {
    // No job finished yet: gittins ranks as dlas.
    // 1 is in a lower queue than 2; 3 is below the first threshold, older than 2.
    let jobs = [
        job(1, 0, 30 * MINUTE, 5, 0, None),
        job(2, 10, 0, 0, 0, None),
        job(3, 5, MINUTE, 1, 0, None),
        job(4, 20, 60 * MINUTE, 9, 0, Some(1)),
    ];
    assert_eq!(order("srtf", &jobs), [4, 3, 2, 1]);
    assert_eq!(order("dlas", &jobs[..3]), [3, 2, 1]);
    assert_eq!(order("las", &jobs[..3]), [2, 3, 1]);
}

#[test]
fn dlas_queues_follow_the_thresholds() {
    let dlas = Dlas::new(vec![10, 100], 0);
    let queue_at = |attained| dlas.queue(&job(1, 0, attained, 1, 0, None));
    assert_eq!(
        [0, 9, 10, 99, 100, 10_000].map(queue_at),
        [0, 0, 1, 1, 2, 2]
    );
    assert_eq!(dlas.refresh_interval(), None, "no guard, keys never age");
}

#[test]
fn dlas_runs_arrival_order_within_a_queue_and_lower_queues_first() {
    let p = Dlas::new(vec![10, 100], 0);
    let mut jobs = [
        job(1, 0, 50, 5, 0, None),   // queue 1, oldest
        job(2, 1, 5, 1, 0, None),    // queue 0
        job(3, 2, 99, 9, 0, None),   // queue 1, most served
        job(4, 3, 0, 0, 0, None),    // queue 0, newest
        job(5, 4, 500, 50, 0, None), // queue 2
    ];
    jobs.sort_by(|a, b| p.compare(a, b));
    assert_eq!(jobs.map(|j| j.id), [2, 4, 1, 3, 5]);
}

#[test]
fn dlas_promotes_a_starved_job_and_restarts_its_counts() {
    let p = Dlas::new(vec![10, 100], 4);
    assert!(p.refresh_interval().is_some());
    let mut starved = job(1, 0, 50, 5, 0, None);
    starved.waited = 199; // below 4 x 50
    assert_eq!(p.queue(&starved), 1);
    starved.waited = 200;
    assert_eq!(p.queue(&starved), 0, "promoted");
    // Counts restart at the promotion: 9 more units of service stay in
    // queue 0, 10 more demote it again, however long it waited before.
    starved.attained = 59;
    assert_eq!(p.queue(&starved), 0);
    starved.attained = 60;
    assert_eq!(p.queue(&starved), 1);
    // Promoted again once it has waited 4 x its 10 units since.
    starved.waited = 239;
    assert_eq!(p.queue(&starved), 1);
    starved.waited = 240;
    assert_eq!(p.queue(&starved), 0);
    // A job that left is forgotten: a new job with its id starts afresh.
    p.forget(&job(1, 0, 60, 6, 0, None));
    let mut fresh = job(1, 0, 60, 6, 0, None);
    fresh.waited = 10;
    assert_eq!(p.queue(&fresh), 1);
}

#[test]
fn dlas_never_promotes_without_a_knob_or_from_queue_zero() {
    let mut long_wait = job(1, 0, 50, 5, 0, None);
    long_wait.waited = u64::MAX / 2;
    assert_eq!(Dlas::new(vec![10], 0).queue(&long_wait), 1);
    // In queue 0 already: nothing to promote, and no state is kept.
    let p = Dlas::new(vec![100], 4);
    assert_eq!(p.queue(&long_wait), 0);
    long_wait.attained = 150;
    long_wait.waited = 0;
    assert_eq!(p.queue(&long_wait), 1);
}

/// The core re-keys waiting jobs as time passes, so a starved job runs.
#[test]
fn the_core_promotes_a_starved_dlas_job_while_it_waits() {
    use crate::{Decision, Hints, JobId, LaneId, SchedConfig, Scheduler};
    const S: Nanos = 1_000_000_000;
    let lane = LaneId(0);
    let mut s: Scheduler<u64> =
        Scheduler::new(Box::new(Dlas::new(vec![10 * S], 2)), SchedConfig::default());
    s.add_job(JobId(1), lane, Hints::default(), 0).unwrap();
    let mut now = 0;
    // Job 1 runs 10 s and drops to queue 1.
    s.submit(JobId(1), 1, now).unwrap();
    let Decision::Run(d) = s.next(lane, now) else {
        panic!("job 1 runs")
    };
    now += 10 * S;
    s.finish(d.job, lane, Some(10 * S), now);
    s.submit(JobId(1), 1, now).unwrap();
    // Job 2 arrives in queue 0 and keeps the lane while job 1 waits...
    s.add_job(JobId(2), lane, Hints::default(), now).unwrap();
    let started = now;
    let mut ran = Vec::new();
    while now < started + 30 * S {
        s.submit(JobId(2), 2, now).unwrap_or(lane);
        let Decision::Run(d) = s.next(lane, now) else {
            panic!("a job runs")
        };
        ran.push((d.work, now - started));
        now += S;
        s.finish(d.job, lane, Some(S / 10), now);
        if d.work == 1 {
            s.submit(JobId(1), 1, now).unwrap();
        }
    }
    // ...until it has waited 2 x its 10 s of service (job 2's own service
    // stays under the threshold, charged 0.1 s per iteration).
    let first = ran.iter().find(|(job, _)| *job == 1).expect("job 1 ran");
    assert!(
        (20 * S..=21 * S).contains(&first.1),
        "job 1 first ran at {:?}",
        first.1
    );
}

#[test]
fn fair_uses_the_offset_count_not_raw_attained() {
    let mut newcomer = job(2, 50, 0, 0, 0, None);
    newcomer.fair_attained = 400;
    let old = job(1, 0, 300, 3, 0, None);
    assert_eq!(order("fair", &[old, newcomer]), [1, 2]);
    assert_eq!(order("las", &[old, newcomer]), [2, 1]);
}

#[test]
fn unknown_names_are_clear_errors_and_known_ones_round_trip() {
    let err = by_name("sjf").err().unwrap();
    assert!(err
        .to_string()
        .contains("unknown scheduling policy \"sjf\""));
    for name in NAMES {
        assert_eq!(by_name(name).unwrap().name(), *name);
    }
    assert_eq!(by_name("fifo").unwrap().hold(), Hold::Always);
    assert_eq!(by_name("pack").unwrap().hold(), Hold::Never);
    assert_eq!(by_name("srtf").unwrap().hold(), Hold::WhileActive);
}
