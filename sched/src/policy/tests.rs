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
        iterations,
        priority,
        remaining,
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

#[test]
fn srtf_without_estimates_is_las() {
    let jobs = [job(1, 0, 500, 5, 0, None), job(2, 1, 100, 1, 0, None)];
    assert_eq!(order("srtf", &jobs), order("las", &jobs));
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
