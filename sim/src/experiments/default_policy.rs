//! (f) Which policy is the server's default: `learned` against `fair`, both
//! told nothing (no length hints), on every trace family the project has:
//! - the paper's training traces (100 jobs of 1, 5 or 10 min, every 30 s),
//!   seeds 1-8;
//! - heavy-tailed traces with no names and no history (those of
//!   [`super::learning`]), seeds 1-32;
//! - recurring traces ([`crate::recurring`]), seeds 1-32, at the default
//!   load and at three times it.
//!
//! `learned` becomes the default only if, on every trace, its mean JCT is at
//! most [`MEAN_BOUND`] times `fair`'s and its p95 JCT at most [`P95_BOUND`]
//! times, and it reaches [`SHARE_BOUND`] of SRTF's gain over FIFO (mean over
//! the recurring traces' seeds 1-8). The `estimators` experiment runs the
//! same with each estimator of the law of jobs without history
//! ([`Estimator`]), to choose one, on seeds 1-8 of each family.
//!
//! Every simulation is independent, so they run on every core; the results
//! do not depend on how many.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use salus_sched::lanes::LaneRule;
use salus_sched::policy::population::Estimator;

use super::learning::{lengths, spec, spread, HEAVY_LOAD_FACTOR, INTERARRIVAL_S};
use super::{
    one_device, share_of_gain, training_spec, Report, TRAINING_INTERARRIVAL_S, TRAINING_JOBS,
};
use crate::engine::{simulate, SimConfig};
use crate::recurring::{self, Recurrence};
use crate::report::Summary;
use crate::trace::{self, TraceJob};
use crate::workload::WorkloadTable;
use crate::SimError;

/// `learned`'s mean JCT over `fair`'s, at most, on every trace.
pub const MEAN_BOUND: f64 = 1.02;
/// `learned`'s p95 JCT over `fair`'s, at most, on every trace.
pub const P95_BOUND: f64 = 1.05;
/// `learned`'s share of SRTF's gain over FIFO on recurring traces, at least
/// (mean over seeds 1-[`SHARE_SEEDS`]).
pub const SHARE_BOUND: f64 = 0.85;
pub const SHARE_SEEDS: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Training,
    HeavyTailed,
    Recurring,
    RecurringHeavyLoad,
}

impl Family {
    const ALL: [Family; 4] = [
        Family::Training,
        Family::HeavyTailed,
        Family::Recurring,
        Family::RecurringHeavyLoad,
    ];

    fn label(self) -> String {
        match self {
            Family::Training => format!(
                "training ({TRAINING_JOBS} jobs of 1/5/10 min, every {TRAINING_INTERARRIVAL_S:.0} s)"
            ),
            Family::HeavyTailed => {
                format!("heavy-tailed, no names, no history (every {INTERARRIVAL_S:.0} s)")
            }
            Family::Recurring => format!("recurring (every {INTERARRIVAL_S:.0} s)"),
            Family::RecurringHeavyLoad => format!(
                "recurring, {HEAVY_LOAD_FACTOR}x load (every {:.0} s)",
                INTERARRIVAL_S / HEAVY_LOAD_FACTOR
            ),
        }
    }

    fn seeds(self, at_most: u64) -> std::ops::RangeInclusive<u64> {
        match self {
            Family::Training => 1..=8.min(at_most),
            _ => 1..=32.min(at_most),
        }
    }

    fn recurring(self) -> bool {
        matches!(self, Family::Recurring | Family::RecurringHeavyLoad)
    }

    fn trace(self, seed: u64, table: &WorkloadTable) -> Result<Vec<TraceJob>, SimError> {
        match self {
            Family::Training => trace::generate(&training_spec(seed), table),
            Family::HeavyTailed => {
                trace::generate_with(&spec(seed, INTERARRIVAL_S), &lengths(), table)
            }
            Family::Recurring => recurring::generate(
                &spec(seed, INTERARRIVAL_S),
                &lengths(),
                &Recurrence::default(),
                table,
            ),
            Family::RecurringHeavyLoad => recurring::generate(
                &spec(seed, INTERARRIVAL_S / HEAVY_LOAD_FACTOR),
                &lengths(),
                &Recurrence::default(),
                table,
            ),
        }
    }
}

/// What runs on each trace: the references, told lengths, and the
/// candidates, told nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Run {
    Fifo,
    Srtf,
    Fair,
    Learned(Estimator),
}

impl Run {
    fn config(self, capacity: u64, lane_rule: LaneRule) -> SimConfig {
        let (policy, hints) = match self {
            Run::Fifo => ("fifo", true),
            Run::Srtf => ("srtf", true),
            Run::Fair => ("fair", false),
            Run::Learned(_) => ("learned", false),
        };
        let estimator = match self {
            Run::Learned(estimator) => estimator,
            _ => Estimator::default(),
        };
        SimConfig {
            length_hints: hints,
            estimator,
            ..one_device(policy, capacity, lane_rule)
        }
    }
}

/// Mean and p95 JCT of one run.
#[derive(Clone, Copy, Default)]
struct Jct {
    mean: f64,
    p95: f64,
}

/// Runs every (trace, run) pair on every core; results in task order.
fn run_all(
    tasks: &[(Family, u64, Run)],
    table: &WorkloadTable,
    capacity: u64,
    lane_rule: LaneRule,
) -> Result<Vec<Jct>, SimError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Jct, SimError>>>> =
        Mutex::new((0..tasks.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(tasks.len()) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(family, seed, run)) = tasks.get(at) else {
                    break;
                };
                let result = family.trace(seed, table).and_then(|jobs| {
                    let summary =
                        Summary::of(&simulate(&jobs, table, &run.config(capacity, lane_rule))?);
                    Ok(Jct {
                        mean: summary.mean_jct_s,
                        p95: summary.p95_jct_s,
                    })
                });
                results.lock().unwrap_or_else(|p| p.into_inner())[at] = Some(result);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every task ran"))
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

pub fn default_policy(
    table: &WorkloadTable,
    capacity: u64,
    lane_rule: LaneRule,
    estimators: &[Estimator],
    seeds_at_most: u64,
) -> Result<Report, SimError> {
    let mut runs = vec![Run::Fifo, Run::Srtf, Run::Fair];
    runs.extend(estimators.iter().map(|&e| Run::Learned(e)));
    let tasks: Vec<(Family, u64, Run)> = Family::ALL
        .iter()
        .flat_map(|&family| family.seeds(seeds_at_most).map(move |seed| (family, seed)))
        .flat_map(|(family, seed)| runs.iter().map(move |&run| (family, seed, run)))
        .collect();
    let results = run_all(&tasks, table, capacity, lane_rule)?;
    let jct = |family: Family, seed: u64, run: Run| -> Jct {
        tasks
            .iter()
            .position(|&t| t == (family, seed, run))
            .map(|at| results[at])
            .unwrap_or_default()
    };

    let mut text = format!(
        "(f) the default policy: learned against fair, both told nothing (fifo and srtf told every \
         length), one {} GiB device\n\
         bounds on every trace: learned/fair mean JCT <= {MEAN_BOUND}, p95 JCT <= {P95_BOUND}; \
         recurring: learned's share of SRTF's gain over FIFO >= {:.0}% (mean over seeds 1-{SHARE_SEEDS})\n",
        capacity >> 30,
        100.0 * SHARE_BOUND
    );
    let mut csv = String::from("family,seed,policy,estimator,mean_jct_s,p95_jct_s\n");
    for &(family, seed, run) in &tasks {
        let r = jct(family, seed, run);
        let (policy, estimator) = match run {
            Run::Fifo => ("fifo", ""),
            Run::Srtf => ("srtf", ""),
            Run::Fair => ("fair", ""),
            Run::Learned(e) => ("learned", e.name()),
        };
        let _ = writeln!(
            csv,
            "{family:?},{seed},{policy},{estimator},{:.3},{:.3}",
            r.mean, r.p95
        );
    }
    let mut all_met = Vec::new();
    for &estimator in estimators {
        let learned = Run::Learned(estimator);
        let _ = writeln!(
            text,
            "\nestimator {} (law of jobs without history)\n{:<48} {:>24} {:>24} {:>22} {:>14}",
            estimator.name(),
            "traces",
            "mean learned/fair",
            "p95 learned/fair",
            "share of SRTF's gain",
            "fair's share"
        );
        let mut met = true;
        for family in Family::ALL {
            let seeds: Vec<u64> = family.seeds(seeds_at_most).collect();
            let mean_ratio: Vec<f64> = seeds
                .iter()
                .map(|&s| jct(family, s, learned).mean / jct(family, s, Run::Fair).mean)
                .collect();
            let p95_ratio: Vec<f64> = seeds
                .iter()
                .map(|&s| jct(family, s, learned).p95 / jct(family, s, Run::Fair).p95)
                .collect();
            let share = |run: Run, seeds: &[u64]| -> f64 {
                seeds
                    .iter()
                    .map(|&s| {
                        share_of_gain(
                            jct(family, s, Run::Fifo).mean,
                            jct(family, s, Run::Srtf).mean,
                            jct(family, s, run).mean,
                        )
                    })
                    .sum::<f64>()
                    / seeds.len() as f64
            };
            let (m_min, m_med, _, m_max) = spread(&mean_ratio);
            let (p_min, p_med, _, p_max) = spread(&p95_ratio);
            let first: Vec<u64> = seeds
                .iter()
                .copied()
                .filter(|&s| s <= SHARE_SEEDS)
                .collect();
            let learned_share = share(learned, &first);
            let _ = writeln!(
                text,
                "{:<48} {:>6.3} / {:>5.3} / {:>5.3} {:>6.3} / {:>5.3} / {:>5.3} {:>13.1}% (1-{SHARE_SEEDS}) {:>13.1}%",
                format!("{} {}-{}", family.label(), seeds[0], seeds[seeds.len() - 1]),
                m_min,
                m_med,
                m_max,
                p_min,
                p_med,
                p_max,
                100.0 * learned_share,
                100.0 * share(Run::Fair, &first),
            );
            let worst: Vec<String> = seeds
                .iter()
                .zip(mean_ratio.iter().zip(&p95_ratio))
                .filter(|(_, (&m, &p))| m > MEAN_BOUND || p > P95_BOUND)
                .map(|(s, (m, p))| format!("seed {s}: mean {m:.3}, p95 {p:.3}"))
                .collect();
            if !worst.is_empty() {
                let _ = writeln!(text, "    beyond a bound: {}", worst.join("; "));
                met = false;
            }
            if family.recurring() && learned_share < SHARE_BOUND {
                met = false;
            }
        }
        let _ = writeln!(
            text,
            "  learned ({}) within every bound: {}",
            estimator.name(),
            verdict(met)
        );
        all_met.push(met);
    }
    let _ = writeln!(
        text,
        "(columns: min / median / max over the seeds; a ratio below 1 is learned's gain)"
    );
    Ok(Report {
        text,
        files: vec![("default_policy.csv".into(), csv)],
    })
}
