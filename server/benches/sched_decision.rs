//! Cost of one scheduling decision with 1,000 queued jobs in a lane (target:
//! at most 5 us). Each measured step is a full cycle: pick (`next`), account
//! (`finish`) and re-queue the job's next iteration. The jobs belong to one
//! tenant (the plain walk), or to 10 tenants (`--share tenants`: one walk
//! takes each tenant's turn; tenant j % 10 owns job j).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use salus_server::sched::policy::by_name;
use salus_server::sched::{Decision, Hints, JobId, LaneId, SchedConfig, Scheduler, TenantId};

const JOBS: u64 = 1_000;

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

fn decisions(c: &mut Criterion) {
    for tenants in [1, 10] {
        let mut group = c.benchmark_group(format!("decision_1000_queued_jobs_{tenants}_tenants"));
        decisions_of(&mut group, tenants);
        group.finish();
    }
}

fn decisions_of(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tenants: u64,
) {
    for policy in ["fifo", "srtf", "pack", "fair", "rr", "priority", "las"] {
        group.bench_function(BenchmarkId::from_parameter(policy), |b| {
            let mut s = loaded(policy, tenants);
            let mut now = JOBS;
            b.iter(|| {
                now += 1_000;
                match s.next(LaneId(0), now) {
                    Decision::Run(d) => {
                        s.finish(d.job, d.lane, Some(1_000 + d.work % 97), now);
                        s.submit(d.job, black_box(d.work), now).unwrap();
                    }
                    other => panic!("a queued job must run, got {other:?}"),
                }
            });
        });
    }
}

criterion_group!(benches, decisions);
criterion_main!(benches);
