//! Sharing between tenants, driven in virtual time.

use std::collections::HashMap;

use super::policy::by_name;
use super::tenants::IDLE_CREDIT;
use super::*;

const MS: Nanos = 1_000_000;
const L: LaneId = LaneId(0);

fn sched(policy: &str, share: Share) -> Scheduler<JobId> {
    Scheduler::new(
        by_name(policy).unwrap(),
        SchedConfig {
            lane_concurrency: 1,
            anticipation: 2 * MS,
            share,
        },
    )
}

/// Adds `jobs` to the lane: (job, tenant, hints).
fn add(s: &mut Scheduler<JobId>, jobs: &[(u64, u64, Hints)], now: Nanos) {
    for (job, tenant, hints) in jobs {
        s.add_tenant_job(JobId(*job), L, TenantId(*tenant), hints.clone(), now)
            .unwrap();
    }
}

/// Every listed job keeps an iteration queued (it resubmits as soon as one
/// ends); runs `rounds` decisions of `cost` each and returns iterations per job.
fn run_saturated(
    s: &mut Scheduler<JobId>,
    jobs: &[u64],
    rounds: usize,
    cost: Nanos,
    now: &mut Nanos,
) -> HashMap<u64, u64> {
    for &job in jobs {
        if s.status(JobId(job)).unwrap().queued == 0 {
            s.submit(JobId(job), JobId(job), *now).unwrap();
        }
    }
    let mut ran = HashMap::new();
    for _ in 0..rounds {
        let d = match s.next(L, *now) {
            Decision::Run(d) => d,
            // A least-served job between iterations holds the lane briefly.
            Decision::WaitUntil(until) => match s.next(L, until) {
                Decision::Run(d) => {
                    *now = until;
                    d
                }
                other => panic!("nothing ran after the wait: {other:?}"),
            },
            Decision::Idle => panic!("a saturated lane always runs something"),
        };
        *now += cost;
        s.finish(d.job, d.lane, Some(cost), *now);
        s.submit(d.job, d.job, *now).unwrap();
        *ran.entry(d.job.0).or_default() += 1;
    }
    ran
}

fn service_of(s: &Scheduler<JobId>, tenant: u64) -> Nanos {
    s.tenant_status()
        .iter()
        .find(|t| t.id == TenantId(tenant))
        .map_or(0, |t| t.service)
}

#[test]
fn one_job_against_eight_gets_half_the_device_by_tenant() {
    for policy in [
        "fair", "pack", "rr", "las", "priority", "srtf", "dlas", "gittins",
    ] {
        let mut s = sched(policy, Share::Tenants);
        let mut jobs = vec![(1, 1, Hints::default())];
        jobs.extend((2..=9).map(|j| (j, 2, Hints::default())));
        add(&mut s, &jobs, 0);
        let mut now = 0;
        let ran = run_saturated(&mut s, &(1..=9).collect::<Vec<_>>(), 400, MS, &mut now);
        let lone = ran[&1];
        let crowd: u64 = (2..=9).map(|j| ran.get(&j).copied().unwrap_or(0)).sum();
        assert_eq!(lone + crowd, 400);
        assert!(lone.abs_diff(crowd) <= 1, "{policy}: {lone} vs {crowd}");
        assert!(
            service_of(&s, 1).abs_diff(service_of(&s, 2)) <= MS,
            "{policy}"
        );
    }
}

#[test]
fn inside_a_tenant_fair_shares_equally_between_its_jobs() {
    let mut s = sched("fair", Share::Tenants);
    let mut jobs = vec![(1, 1, Hints::default())];
    jobs.extend((2..=5).map(|j| (j, 2, Hints::default())));
    add(&mut s, &jobs, 0);
    let mut now = 0;
    let ran = run_saturated(&mut s, &[1, 2, 3, 4, 5], 800, MS, &mut now);
    assert_eq!(ran[&1], 400);
    for j in 2..=5 {
        assert_eq!(ran[&j], 100, "job {j}: {ran:?}");
    }
}

#[test]
fn sharing_by_jobs_gives_each_job_a_share() {
    let mut s = sched("fair", Share::Jobs);
    let mut jobs = vec![(1, 1, Hints::default())];
    jobs.extend((2..=5).map(|j| (j, 2, Hints::default())));
    add(&mut s, &jobs, 0);
    let mut now = 0;
    let ran = run_saturated(&mut s, &[1, 2, 3, 4, 5], 500, MS, &mut now);
    for j in 1..=5 {
        assert_eq!(ran[&j], 100, "{ran:?}");
    }
}

#[test]
fn weights_divide_the_device_in_proportion() {
    let mut s = sched("fair", Share::Tenants);
    s.set_tenant_weight(TenantId(1), 3).unwrap();
    assert_eq!(
        s.set_tenant_weight(TenantId(2), 0),
        Err(SchedError::BadWeight(0))
    );
    assert_eq!(
        s.set_tenant_weight(TenantId(2), tenants::MAX_WEIGHT + 1),
        Err(SchedError::BadWeight(tenants::MAX_WEIGHT + 1))
    );
    add(
        &mut s,
        &[
            (1, 1, Hints::default()),
            (2, 2, Hints::default()),
            (3, 2, Hints::default()),
        ],
        0,
    );
    let mut now = 0;
    let ran = run_saturated(&mut s, &[1, 2, 3], 400, MS, &mut now);
    assert!(ran[&1].abs_diff(300) <= 1, "{ran:?}");
    assert!((ran[&2] + ran[&3]).abs_diff(100) <= 1, "{ran:?}");
    let weights: Vec<u32> = s.tenant_status().iter().map(|t| t.weight).collect();
    assert_eq!(weights, vec![3, 1]);
}

#[test]
fn the_policy_orders_a_tenants_own_jobs() {
    // Under priority, tenant 2's priority-5 job takes all of tenant 2's share.
    let mut s = sched("priority", Share::Tenants);
    let high = Hints {
        priority: 5,
        ..Hints::default()
    };
    add(
        &mut s,
        &[
            (1, 1, Hints::default()),
            (2, 2, Hints::default()),
            (3, 2, high),
        ],
        0,
    );
    let mut now = 0;
    let ran = run_saturated(&mut s, &[1, 2, 3], 200, MS, &mut now);
    assert_eq!((ran[&1], ran.get(&2).copied(), ran[&3]), (100, None, 100));
}

#[test]
fn a_tenant_that_arrives_late_shares_from_then_on_without_a_backlog() {
    let mut s = sched("fair", Share::Tenants);
    add(&mut s, &[(1, 1, Hints::default())], 0);
    let mut now = 0;
    run_saturated(&mut s, &[1], 100, MS, &mut now);
    add(&mut s, &[(2, 2, Hints::default())], now);
    let ran = run_saturated(&mut s, &[1, 2], 20, MS, &mut now);
    assert!(ran[&1].abs_diff(ran[&2]) <= 1, "{ran:?}");
}

#[test]
fn credit_survives_a_short_pause_and_not_a_long_one() {
    for (pause, keeps_credit) in [(IDLE_CREDIT / 2, true), (IDLE_CREDIT * 2, false)] {
        let mut s = sched("fair", Share::Tenants);
        add(
            &mut s,
            &[(1, 1, Hints::default()), (2, 2, Hints::default())],
            0,
        );
        let mut now = 0;
        run_saturated(&mut s, &[1, 2], 10, MS, &mut now);
        // Tenant 1 pauses (its job stays open, its queued iteration is given
        // up); tenant 2 runs alone meanwhile.
        assert_eq!(s.drain_queued(|w| *w != JobId(1)), vec![JobId(1)]);
        let rounds = (pause / MS) as usize;
        let alone = run_saturated(&mut s, &[2], rounds, MS, &mut now);
        assert_eq!(alone[&2] as usize, rounds);
        // Back: with its credit it runs until even; without, it alternates at once.
        let ran = run_saturated(&mut s, &[1, 2], 20, MS, &mut now);
        if keeps_credit {
            assert_eq!(ran[&1], 20, "pause {pause}: {ran:?}");
        } else {
            assert!(ran[&1].abs_diff(ran[&2]) <= 1, "pause {pause}: {ran:?}");
        }
    }
}

#[test]
fn a_least_served_tenant_between_iterations_holds_the_lane_briefly() {
    let mut s = sched("fair", Share::Tenants);
    add(
        &mut s,
        &[(1, 1, Hints::default()), (2, 2, Hints::default())],
        0,
    );
    let mut now = 0;
    run_saturated(&mut s, &[1, 2], 10, MS, &mut now);
    // Drain: tenant 2's iteration is queued, tenant 1's job between iterations.
    s.remove_job(JobId(1)).unwrap();
    add(&mut s, &[(1, 1, Hints::default())], now);
    s.submit(JobId(1), JobId(1), now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!()
    };
    assert_eq!(d.job, JobId(1), "tenant 1 is behind after a new job");
    now += MS;
    s.finish(d.job, d.lane, Some(MS), now);
    // Tenant 1 is still behind (it rejoined at the floor): the lane waits for it.
    let ahead = s.tenants.vtime(TenantId(1)) < s.tenants.vtime(TenantId(2));
    match s.next(L, now) {
        Decision::WaitUntil(until) => {
            assert!(ahead);
            assert_eq!(until, now + 2 * MS);
            // Once the window passes, tenant 2 runs.
            let Decision::Run(d) = s.next(L, until) else {
                panic!()
            };
            assert_eq!(d.job, JobId(2));
        }
        Decision::Run(d) => {
            assert!(!ahead);
            assert_eq!(d.job, JobId(2));
        }
        Decision::Idle => panic!("tenant 2 has work"),
    }
}

#[test]
fn a_fifo_job_holds_its_own_tenant_only() {
    let mut s = sched("fifo", Share::Tenants);
    add(
        &mut s,
        &[
            (1, 1, Hints::default()),
            (2, 1, Hints::default()),
            (3, 2, Hints::default()),
        ],
        0,
    );
    let mut now = 0;
    s.submit(JobId(1), JobId(1), now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!()
    };
    now += MS;
    s.finish(d.job, d.lane, Some(MS), now);
    // Job 1 has started and lives: job 2 (its tenant's) waits for good, job 3
    // (another tenant's) waits only through the anticipation window.
    s.submit(JobId(2), JobId(2), now).unwrap();
    s.submit(JobId(3), JobId(3), now).unwrap();
    assert!(!s.can_defer_boundary(JobId(1)));
    let later = now + 100 * MS;
    let Decision::Run(d) = s.next(L, later) else {
        panic!()
    };
    assert_eq!(d.job, JobId(3));
    s.finish(d.job, d.lane, Some(MS), later + MS);
    assert!(matches!(s.next(L, later + 200 * MS), Decision::Idle));
    s.remove_job(JobId(1)).unwrap();
    let Decision::Run(d) = s.next(L, later + 200 * MS) else {
        panic!()
    };
    assert_eq!(d.job, JobId(2));
}

#[test]
fn another_tenants_queued_iteration_outranks_by_tenant_share() {
    let mut s = sched("priority", Share::Tenants);
    let high = Hints {
        priority: 9,
        ..Hints::default()
    };
    add(&mut s, &[(1, 1, high.clone()), (2, 2, Hints::default())], 0);
    let mut now = 0;
    run_saturated(&mut s, &[1], 3, MS, &mut now);
    // Tenant 1 has used the device; tenant 2's queued iteration is ahead of
    // any brief run of job 1 however high its priority.
    s.remove_job(JobId(1)).unwrap();
    add(&mut s, &[(1, 1, high.clone())], now);
    s.submit(JobId(2), JobId(2), now).unwrap();
    let t1 = s.tenants.vtime(TenantId(1));
    let t2 = s.tenants.vtime(TenantId(2));
    assert_eq!(s.outranked(JobId(1)), t2 < t1);
    // Under sharing by jobs, priority alone decides.
    let mut s = sched("priority", Share::Jobs);
    add(&mut s, &[(1, 1, high), (2, 2, Hints::default())], 0);
    s.submit(JobId(2), JobId(2), 0).unwrap();
    assert!(!s.outranked(JobId(1)));
}

#[test]
fn device_time_per_tenant_is_kept_after_its_jobs_leave() {
    let mut s = sched("fair", Share::Tenants);
    add(
        &mut s,
        &[(1, 1, Hints::default()), (2, 2, Hints::default())],
        0,
    );
    let mut now = 0;
    run_saturated(&mut s, &[1, 2], 10, MS, &mut now);
    s.charge_outside_run(JobId(1), 3 * MS);
    s.remove_job(JobId(1)).unwrap();
    let status = s.tenant_status();
    assert_eq!(status.len(), 2);
    assert_eq!(
        (status[0].id, status[0].service, status[0].jobs),
        (TenantId(1), 8 * MS, 0)
    );
    assert_eq!(
        (status[1].id, status[1].service, status[1].jobs),
        (TenantId(2), 5 * MS, 1)
    );
    assert_eq!(s.status(JobId(2)).unwrap().tenant, TenantId(2));
}

#[test]
fn a_tenant_that_forfeits_its_credit_shares_from_then_on_instead_of_catching_up() {
    // Tenant 1 ran alone for a while (tenant 2's executor was stopped, its
    // pause shorter than IDLE_CREDIT); then tenant 2 comes back.
    let run_after_pause = |forfeit: bool| {
        let mut s = sched("fair", Share::Tenants);
        let mut now = 0;
        add(&mut s, &[(1, 1, Hints::default()), (2, 2, Hints::default())], now);
        // Tenant 2 is stopped for 0.5 s, within IDLE_CREDIT: tenant 1 runs alone.
        run_saturated(&mut s, &[1], 50, 10 * MS, &mut now);
        assert!(now < IDLE_CREDIT);
        if forfeit {
            s.forfeit_credit(TenantId(2), now);
        }
        // The next 10 decisions: how many go to tenant 2?
        run_saturated(&mut s, &[1, 2], 10, 10 * MS, &mut now)
            .get(&2)
            .copied()
            .unwrap_or(0)
    };
    // Banked, it would take every turn until it caught up; forfeited, it shares.
    assert_eq!(run_after_pause(false), 10);
    assert!((4..=6).contains(&run_after_pause(true)), "{}", run_after_pause(true));
}
