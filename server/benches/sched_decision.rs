//! Cost of one scheduling decision with 1,000 queued jobs in a lane (target:
//! at most 5 us). Each measured step is a full cycle: pick (`next`), account
//! (`finish`) and re-queue the job's next iteration. The jobs belong to one
//! tenant (the plain walk), or to 10 tenants (`--share tenants`: one walk
//! takes each tenant's turn; tenant j % 10 owns job j).
//!
//! A plain timing loop (no benchmark framework: criterion's dependencies cost
//! every `cargo test` build about a minute): per policy, SAMPLES samples of
//! about SAMPLE_MS each after a warm-up, printed as min / median / max ns per
//! decision. `cargo bench -p salus-server --bench sched_decision [FILTER]`
//! runs the policies whose name contains FILTER.

use std::hint::black_box;
use std::time::{Duration, Instant};

use salus_server::sched::policy::by_name;
use salus_server::sched::{Decision, Hints, JobId, LaneId, SchedConfig, Scheduler, TenantId};

const JOBS: u64 = 1_000;
const POLICIES: [&str; 8] = [
    "fifo", "srtf", "pack", "fair", "rr", "priority", "las", "learned",
];
const SAMPLES: usize = 7;
const SAMPLE_MS: u64 = 200;

fn loaded(policy: &str, tenants: u64) -> Scheduler<u64> {
    let mut s = Scheduler::new(
        by_name(policy).unwrap(),
        SchedConfig {
            lane_concurrency: 1,
            anticipation: 2_000_000,
            ..SchedConfig::default()
        },
    );
    for j in 0..JOBS {
        let hints = Hints {
            priority: (j % 7) as i32,
            expected_iterations: Some(100 + j % 50),
            ..Default::default()
        };
        s.add_tenant_job(JobId(j), LaneId(0), TenantId(1 + j % tenants), hints, j)
            .unwrap();
        s.submit(JobId(j), j, j).unwrap();
    }
    s
}

/// One decision cycle: pick, account, re-queue.
fn cycle(s: &mut Scheduler<u64>, now: &mut u64) {
    *now += 1_000;
    match s.next(LaneId(0), *now) {
        Decision::Run(d) => {
            s.finish(d.job, d.lane, Some(1_000 + d.work % 97), *now);
            s.submit(d.job, black_box(d.work), *now).unwrap();
        }
        other => panic!("a queued job must run, got {other:?}"),
    }
}

/// ns per decision of one sample of about `length`.
fn sample(s: &mut Scheduler<u64>, now: &mut u64, length: Duration) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < length {
        for _ in 0..256 {
            cycle(s, now);
        }
        n += 256;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    // `cargo bench` passes `--bench`; anything else not starting with '-' filters.
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    for tenants in [1, 10] {
        println!("decision with {JOBS} queued jobs, {tenants} tenant(s): ns per decision, min / median / max of {SAMPLES}");
        for policy in POLICIES.iter().filter(|p| p.contains(filter.as_str())) {
            let mut s = loaded(policy, tenants);
            let mut now = JOBS;
            sample(&mut s, &mut now, Duration::from_millis(SAMPLE_MS)); // warm-up
            let mut ns: Vec<f64> = (0..SAMPLES)
                .map(|_| sample(&mut s, &mut now, Duration::from_millis(SAMPLE_MS)))
                .collect();
            ns.sort_by(f64::total_cmp);
            println!(
                "  {policy:9} {:8.0} {:8.0} {:8.0}",
                ns[0],
                ns[SAMPLES / 2],
                ns[SAMPLES - 1]
            );
        }
    }
}
