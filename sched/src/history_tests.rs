//! The history through the core: jobs of known identities ranked by their
//! earlier runs, runs recorded as jobs end, erasure, memory admission.

use super::lanes::{LaneManager, MemoryNeed, Placement};
use super::policy::by_name;
use super::*;

const S: Nanos = 1_000_000_000;
const L: LaneId = LaneId(0);

fn learned() -> Scheduler<u64> {
    Scheduler::new(by_name("learned").unwrap(), SchedConfig::default())
}

fn who(tenant: &str, name: &str) -> JobIdentity {
    JobIdentity::new(tenant, name, None)
}

/// Runs `id` alone for `iterations` iterations of `each`, then ends it.
fn run_alone(
    s: &mut Scheduler<u64>,
    id: u64,
    identity: JobIdentity,
    iterations: u64,
    each: Nanos,
    now: &mut Nanos,
) {
    let job = JobId(id);
    s.add_identified_job(job, L, TenantId(1), identity, Hints::default(), *now)
        .unwrap();
    for _ in 0..iterations {
        s.submit(job, id, *now).unwrap();
        let Decision::Run(d) = s.next(L, *now) else {
            panic!("job {id} runs")
        };
        *now += each;
        s.finish(d.job, L, Some(each), *now);
    }
    s.end_job(job, RunEnd::Completed).unwrap();
}

#[test]
fn a_job_known_to_be_short_runs_before_an_unknown_long_one_without_hints() {
    let mut s = learned();
    let mut now = 0;
    // The short script ran three times, 10 s each.
    for k in 0..3 {
        run_alone(&mut s, 100 + k, who("alice", "short.py"), 10, S, &mut now);
    }
    let expected = s.expectation(&who("alice", "short.py")).unwrap();
    assert_eq!(expected.runs, 3);
    assert!((expected.median_s - 10.0).abs() < 1e-6, "{expected:?}");
    // The long one (never seen) asks first, the short one right after.
    s.add_identified_job(
        JobId(1),
        L,
        TenantId(1),
        who("alice", "long.py"),
        Hints::default(),
        now,
    )
    .unwrap();
    s.add_identified_job(
        JobId(2),
        L,
        TenantId(1),
        who("alice", "short.py"),
        Hints::default(),
        now,
    )
    .unwrap();
    s.submit(JobId(1), 1, now).unwrap();
    s.submit(JobId(2), 2, now).unwrap();
    let Decision::Run(first) = s.next(L, now) else {
        panic!("a job runs")
    };
    assert_eq!(first.job, JobId(2), "the job known to be short runs first");
    let status = s.status(JobId(2)).unwrap();
    assert_eq!(status.identity, Some(who("alice", "short.py")));
    assert_eq!(status.expected.map(|e| e.runs), Some(3));
    assert_eq!(s.status(JobId(1)).unwrap().expected, None);
}

#[test]
fn runs_are_recorded_by_how_they_ended_and_anonymous_jobs_are_not() {
    let mut s = learned();
    let mut now = 0;
    run_alone(&mut s, 1, who("bob", "a"), 4, S, &mut now);
    let runs = s.history().runs(&who("bob", "a"));
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].device_s, runs[0].iterations), (4.0, 4));
    // A failed run is kept but is not a length.
    s.add_identified_job(
        JobId(2),
        L,
        TenantId(1),
        who("bob", "a"),
        Hints::default(),
        now,
    )
    .unwrap();
    s.submit(JobId(2), 2, now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!("runs")
    };
    s.finish(d.job, L, Some(S / 2), now + S / 2);
    s.end_job(JobId(2), RunEnd::Failed).unwrap();
    assert_eq!(s.history().runs(&who("bob", "a")).len(), 2);
    assert_eq!(s.expectation(&who("bob", "a")).unwrap().runs, 1);
    // A job that never ran an iteration, and one without identity, leave nothing.
    s.add_identified_job(
        JobId(3),
        L,
        TenantId(1),
        who("bob", "idle"),
        Hints::default(),
        now,
    )
    .unwrap();
    s.remove_job(JobId(3)).unwrap();
    s.add_tenant_job(JobId(4), L, TenantId(1), Hints::default(), now)
        .unwrap();
    s.submit(JobId(4), 4, now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!("runs")
    };
    s.finish(d.job, L, Some(S), now + S);
    s.remove_job(JobId(4)).unwrap();
    assert_eq!(s.history().len(), 1);
}

#[test]
fn erasing_a_tenant_forgets_its_identities_only() {
    let mut s = learned();
    let mut now = 0;
    run_alone(&mut s, 1, who("alice", "a"), 2, S, &mut now);
    run_alone(&mut s, 2, who("bob", "a"), 2, S, &mut now);
    assert_eq!(s.erase_history("alice"), 1);
    assert_eq!(s.expectation(&who("alice", "a")), None);
    assert!(s.expectation(&who("bob", "a")).is_some());
}

#[test]
fn a_history_read_back_ranks_as_before_and_feeds_the_population() {
    let mut h = History::default();
    for k in 0..12 {
        h.record(
            &who("t", &format!("s{k}")),
            history::PastRun {
                device_s: 60.0 * (k + 1) as f64,
                iterations: 10,
                end: RunEnd::Completed,
            },
        );
    }
    let mut s = learned();
    s.set_history(History::parse(&h.to_text()).unwrap());
    // Twelve completed runs teach the population: an unknown job is ranked
    // by the Gittins index (a key of at most 1), not by dlas queues (0-3).
    let unknown = s.rank_new(JobId(1), &Hints::default(), 0);
    assert!(unknown.primary < 0, "{unknown:?}");
    let short = s.rank_new_as(JobId(2), Some(&who("t", "s0")), &Hints::default(), 0);
    let long = s.rank_new_as(JobId(3), Some(&who("t", "s11")), &Hints::default(), 0);
    assert!(
        short < unknown && unknown < long,
        "{short:?} {unknown:?} {long:?}"
    );
}

#[test]
fn memory_admission_follows_the_rank_from_history() {
    let mut s = learned();
    let mut now = 0;
    run_alone(&mut s, 100, who("t", "short"), 5, S, &mut now);
    run_alone(&mut s, 101, who("t", "long"), 500, S, &mut now);
    let need = MemoryNeed {
        persistent: 2,
        ephemeral: 2,
    };
    let mut lanes = LaneManager::new(4);
    assert!(matches!(
        lanes.request(JobId(1), need),
        Ok(Placement::Placed(_))
    ));
    // The long job asks first, the short one later: both wait.
    for (id, name) in [(2, "long"), (3, "short")] {
        let rank = s.rank_new_as(JobId(id), Some(&who("t", name)), &Hints::default(), now);
        assert_eq!(
            lanes.request_ranked(JobId(id), need, None, rank),
            Ok(Placement::Waiting)
        );
        now += S;
    }
    // Room for one: the job its history says is short gets it.
    let admitted = lanes.release(JobId(1));
    assert_eq!(
        admitted.iter().map(|(j, _)| *j).collect::<Vec<_>>(),
        [JobId(3)]
    );
}

#[test]
fn srtf_admits_by_hinted_length_too() {
    let s: Scheduler<u64> = Scheduler::new(by_name("srtf").unwrap(), SchedConfig::default());
    let hint = |seconds| Hints {
        expected_seconds: Some(seconds),
        ..Hints::default()
    };
    let long = s.rank_new(JobId(1), &hint(600.0), 0);
    let short = s.rank_new(JobId(2), &hint(60.0), S);
    assert!(short < long);
}

#[test]
fn an_identity_told_after_the_job_joined_reranks_it_and_records_its_run() {
    let mut s = learned();
    let mut now = 0;
    for k in 0..3 {
        run_alone(&mut s, 100 + k, who("alice", "short.py"), 10, S, &mut now);
    }
    for k in 0..3 {
        run_alone(&mut s, 200 + k, who("alice", "long.py"), 1000, S, &mut now);
    }
    // Both join unidentified (a server learns the fingerprint later): the
    // long one, older, ranks first.
    s.add_tenant_job(JobId(1), L, TenantId(1), Hints::default(), now)
        .unwrap();
    s.add_tenant_job(JobId(2), L, TenantId(1), Hints::default(), now + 1)
        .unwrap();
    let before = (s.jobs[&JobId(1)].key, s.jobs[&JobId(2)].key);
    s.set_identity(JobId(1), who("alice", "long.py")).unwrap();
    s.set_identity(JobId(2), who("alice", "short.py")).unwrap();
    assert!(
        s.jobs[&JobId(2)].key < s.jobs[&JobId(1)].key,
        "the short one now ranks first (keys before: {before:?})"
    );
    assert_eq!(
        s.status(JobId(2)).unwrap().expected.map(|e| e.runs),
        Some(3)
    );
    s.submit(JobId(2), 2, now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!("job 2 runs")
    };
    s.finish(d.job, L, Some(S), now + S);
    s.end_job(JobId(2), RunEnd::Completed).unwrap();
    assert_eq!(s.history().runs(&who("alice", "short.py")).len(), 4);
    assert_eq!(
        s.set_identity(JobId(9), who("a", "b")),
        Err(SchedError::UnknownJob(JobId(9)))
    );
}

/// A finished run each of `n` scripts never seen again, 1 to `n` s long:
/// a population for jobs of unknown scripts.
fn population(s: &mut Scheduler<u64>, n: u64, now: &mut Nanos) {
    for k in 1..=n {
        run_alone(s, 1000 + k, who("t", &format!("once{k}.py")), k, S, now);
    }
}

#[test]
fn a_run_of_a_new_script_ranks_as_old_as_its_longest_live_sibling() {
    let mut s = learned();
    let mut now = 0;
    population(&mut s, 20, &mut now);
    // A sweep's first run has done 10 minutes, far past the population,
    // without finishing.
    let first = JobId(1);
    s.add_identified_job(
        first,
        L,
        TenantId(1),
        who("t", "sweep.py"),
        Hints::default(),
        now,
    )
    .unwrap();
    for _ in 0..600 {
        s.submit(first, 1, now).unwrap();
        let Decision::Run(d) = s.next(L, now) else {
            panic!("the first run runs")
        };
        now += S;
        s.finish(d.job, L, Some(S), now);
    }
    // Its second run and a run of another new script arrive together, the
    // sibling first: the other runs first all the same, since the sweep's
    // runs are likely long.
    for (id, name) in [(2, "sweep.py"), (3, "other.py")] {
        s.add_identified_job(
            JobId(id),
            L,
            TenantId(1),
            who("t", name),
            Hints::default(),
            now,
        )
        .unwrap();
        s.submit(JobId(id), id, now).unwrap();
    }
    let Decision::Run(d) = s.next(L, now) else {
        panic!("a job runs")
    };
    assert_eq!(d.job, JobId(3), "the sibling of a long run waits");
    // Memory admission ranks a waiting sibling the same way.
    let sibling = s.rank_new_as(
        JobId(4),
        Some(&who("t", "sweep.py")),
        &Hints::default(),
        now,
    );
    let stranger = s.rank_new_as(JobId(5), Some(&who("t", "new.py")), &Hints::default(), now);
    assert!(stranger < sibling);
    // With no live sibling left, a new run of the script ranks as a stranger.
    s.end_job(JobId(1), RunEnd::Failed).unwrap();
    s.end_job(JobId(2), RunEnd::Failed).unwrap();
    let alone = s.rank_new_as(
        JobId(6),
        Some(&who("t", "sweep.py")),
        &Hints::default(),
        now,
    );
    let stranger = s.rank_new_as(JobId(7), Some(&who("t", "new.py")), &Hints::default(), now);
    assert_eq!(alone.primary, stranger.primary);
}

#[test]
fn a_job_that_joined_midway_records_no_run() {
    let mut s = learned();
    let mut now = 0;
    run_alone(&mut s, 1, who("carol", "a"), 3, S, &mut now);
    // Adopted after a restart of the server: its iterations here are only the rest of its run.
    let job = JobId(2);
    s.add_identified_job(job, L, TenantId(1), who("carol", "a"), Hints::default(), now)
        .unwrap();
    s.joined_midway(job).unwrap();
    s.submit(job, 2, now).unwrap();
    let Decision::Run(d) = s.next(L, now) else {
        panic!("runs")
    };
    s.finish(d.job, L, Some(S), now + S);
    s.end_job(job, RunEnd::Completed).unwrap();
    assert_eq!(s.history().runs(&who("carol", "a")).len(), 1, "only the whole run");
    assert!(s.joined_midway(JobId(99)).is_err());
}
