//! The original paper's three experiments, on the derived workload table,
//! and two of this project's own (`users`: sharing between users;
//! `learning`: the `learned` policy on recurring traces, in [`learning`]).
//! Each returns a printable table and CSV files for plots; docs/EVALUATION.md
//! says what differs from the paper's setup.

use std::fmt::Write as _;

use salus_sched::lanes::{LaneManager, LaneRule, MemoryNeed, Placement};
use salus_sched::policy::population::Estimator;
use salus_sched::{JobId, Share};

use crate::engine::{simulate, SimConfig, SimResult};
use crate::report::{jobs_csv, timeline_csv, user_intervals, user_mean_jct, Summary, UserInterval};
use crate::rng::Rng;
use crate::trace::{self, TraceJob, TraceSpec};
use crate::workload::{WorkloadTable, MIB};
use crate::SimError;

pub mod default_policy;
pub mod learning;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    /// A training trace under every policy: mean JCT, makespan (paper: FIFO/SRTF 3.19x).
    Training,
    /// Hyper-parameter tuning: 300 identical jobs of each of 3 models, packed vs exclusive (paper: 2.38x).
    Hyperparam,
    /// Inference: 14 models x 3 instances, devices needed by rule (paper: 1 vs 6 vs 42).
    Inference,
    /// Users with 1, 8 and 3 jobs on one lane, policy fair, shared by tenants
    /// and by jobs: device time per user while they all have work, JCT.
    Users,
    /// The learned policy on recurring traces (8 seeds, two loads) and on
    /// traces without history: its share of SRTF's gain over FIFO, no hints.
    Learning,
    /// Which policy is the default: learned against fair on every trace family
    /// (training 1-8, heavy-tailed 1-32, recurring 1-32 at two loads), mean and
    /// p95 JCT, and the share of SRTF's gain.
    Default,
    /// The same for each estimator of the law of jobs without history, on
    /// seeds 1-8 of each family.
    Estimators,
}

pub struct Report {
    pub text: String,
    /// (file name, contents).
    pub files: Vec<(String, String)>,
}

/// Runs an experiment; `lane_rule` is the lane rule of its Salus runs, except
/// in the lane-rule comparisons, which always run both rules.
pub fn run(
    which: Experiment,
    table: &WorkloadTable,
    seed: u64,
    capacity: u64,
    lane_rule: LaneRule,
) -> Result<Report, SimError> {
    match which {
        Experiment::Training => {
            let mut report = training(table, seed, capacity, lane_rule)?;
            let (text, csv) = training_lane_rules(table, seed, capacity)?;
            report.text.push_str(&text);
            report.files.push(("training_lane_rules.csv".into(), csv));
            Ok(report)
        }
        Experiment::Hyperparam => hyperparam(table, capacity),
        Experiment::Inference => inference(table, capacity),
        Experiment::Users => users(table, seed),
        Experiment::Learning => learning::learning(table, capacity, lane_rule, seed),
        Experiment::Default => default_policy::default_policy(table, capacity, lane_rule, &[Estimator::default()], 32),
        Experiment::Estimators => default_policy::default_policy(table, capacity, lane_rule, &Estimator::ALL, 8),
    }
}

pub const TRAINING_POLICIES: &[&str] = &[
    "fifo",
    "srtf",
    "pack",
    "fair",
    "las",
    "dlas",
    "gittins",
    "exclusive",
    "mps",
];
/// The policies compared on both the 1/5/10-minute and the heavy-tailed trace.
const LENGTH_POLICIES: &[&str] = &["fifo", "srtf", "las", "dlas", "gittins"];
/// The offline reference's row: SRTF told every job's exact length.
const OFFLINE_BOUND: &str = "srtf-exact";
pub(crate) const TRAINING_JOBS: usize = 100;
pub(crate) const TRAINING_INTERARRIVAL_S: f64 = 30.0;

fn summary_header() -> String {
    "policy,jobs,refused,makespan_s,mean_jct_s,p95_jct_s,utilization,max_lanes\n".into()
}

fn summary_row(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "{},{},{},{:.3},{:.3},{:.3},{:.4},{}",
        s.policy,
        s.jobs,
        s.refused,
        s.makespan_s,
        s.mean_jct_s,
        s.p95_jct_s,
        s.mean_utilization,
        s.max_lanes
    );
}

fn table_line(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "{:<10} {:>12.0} {:>12.0} {:>12.0} {:>9.1}% {:>6}",
        s.policy,
        s.makespan_s,
        s.mean_jct_s,
        s.p95_jct_s,
        s.mean_utilization * 100.0,
        s.max_lanes
    );
}

/// The paper's training trace of `seed`: 100 jobs of 1, 5 or 10 minutes,
/// Poisson arrivals every 30 s on average, every model.
pub(crate) fn training_spec(seed: u64) -> TraceSpec {
    TraceSpec {
        jobs: TRAINING_JOBS,
        seed,
        mean_interarrival_s: TRAINING_INTERARRIVAL_S,
        models: vec![],
        minutes: vec![1.0, 5.0, 10.0],
    }
}

/// (a) 100 training jobs, Poisson arrivals, every model, 1/5/10-minute jobs;
/// then the length policies on a trace with heavy-tailed lengths.
fn training(
    table: &WorkloadTable,
    seed: u64,
    capacity: u64,
    lane_rule: LaneRule,
) -> Result<Report, SimError> {
    let spec = training_spec(seed);
    let jobs = trace::generate(&spec, table)?;
    let mut text = format!(
        "(a) training trace: {TRAINING_JOBS} jobs, Poisson arrivals every {TRAINING_INTERARRIVAL_S} s on average, \
         seed {seed}, one {} GiB device\n{:<10} {:>12} {:>12} {:>12} {:>10} {:>6}\n",
        capacity >> 30,
        "policy",
        "makespan s",
        "mean JCT s",
        "p95 JCT s",
        "util",
        "lanes"
    );
    let mut files = vec![("training_trace.csv".to_string(), trace::to_csv(&jobs))];
    let mut summaries = summary_header();
    let mut mean_jct = std::collections::HashMap::new();
    for policy in TRAINING_POLICIES {
        let config = one_device(policy, capacity, lane_rule);
        let result = simulate(&jobs, table, &config)?;
        let summary = Summary::of(&result);
        table_line(&mut text, &summary);
        summary_row(&mut summaries, &summary);
        mean_jct.insert(*policy, summary.mean_jct_s);
        files.push((format!("training_jobs_{policy}.csv"), jobs_csv(&result)));
        files.push((
            format!("training_timeline_{policy}.csv"),
            timeline_csv(&result.timeline, 500),
        ));
    }
    let bound = offline_bound(&jobs, table, capacity, lane_rule)?;
    table_line(&mut text, &bound);
    summary_row(&mut summaries, &bound);
    let ratio = mean_jct["fifo"] / mean_jct["srtf"];
    let _ = writeln!(text, "FIFO/SRTF mean JCT: {ratio:.2}x (paper: 3.19x)");
    // The ratio depends on load as much as on the scheduler: the same mix at
    // other arrival rates.
    let mut sweep = String::from("load: mean inter-arrival s -> FIFO/SRTF mean JCT:");
    for interarrival in [60.0, 120.0, 240.0, 480.0] {
        let jobs = trace::generate(
            &TraceSpec {
                mean_interarrival_s: interarrival,
                ..spec.clone()
            },
            table,
        )?;
        let mean_of = |policy: &str| -> Result<f64, SimError> {
            let config = one_device(policy, capacity, lane_rule);
            Ok(Summary::of(&simulate(&jobs, table, &config)?).mean_jct_s)
        };
        let _ = write!(
            sweep,
            "  {interarrival:.0}: {:.2}x",
            mean_of("fifo")? / mean_of("srtf")?
        );
    }
    let _ = writeln!(text, "{sweep}");
    files.push(("training_summary.csv".into(), summaries));
    // The same policies on a heavy-tailed trace: same arrival rate and, in
    // distribution, the same mean length.
    let heavy = trace::generate_with(&spec, &trace::JobLengths::heavy_tailed(), table)?;
    let _ = writeln!(
        text,
        "\n(a) training trace, lengths log-normal (median {} min, sigma {}; most short, a few very long)\n\
         {:<10} {:>12} {:>12} {:>12} {:>10} {:>6}",
        trace::HEAVY_TAIL_MEDIAN_MINUTES,
        trace::HEAVY_TAIL_SIGMA,
        "policy",
        "makespan s",
        "mean JCT s",
        "p95 JCT s",
        "util",
        "lanes"
    );
    let mut heavy_summaries = summary_header();
    let mut heavy_jct = std::collections::HashMap::new();
    for policy in LENGTH_POLICIES {
        let config = one_device(policy, capacity, lane_rule);
        let summary = Summary::of(&simulate(&heavy, table, &config)?);
        table_line(&mut text, &summary);
        summary_row(&mut heavy_summaries, &summary);
        heavy_jct.insert(*policy, summary.mean_jct_s);
    }
    let heavy_bound = offline_bound(&heavy, table, capacity, lane_rule)?;
    table_line(&mut text, &heavy_bound);
    summary_row(&mut heavy_summaries, &heavy_bound);
    files.push(("training_heavy_trace.csv".into(), trace::to_csv(&heavy)));
    files.push(("training_heavy_summary.csv".into(), heavy_summaries));
    let bound_line = |jct: &std::collections::HashMap<&str, f64>, bound: &Summary| {
        format!(
            "offline bound ({OFFLINE_BOUND}) {:.0} s; GITTINS/FIFO mean JCT {:.2}, DLAS/FIFO {:.2}; \
             of SRTF's gain over FIFO GITTINS gets {:.0}%, DLAS {:.0}%, LAS {:.0}%",
            bound.mean_jct_s,
            jct["gittins"] / jct["fifo"],
            jct["dlas"] / jct["fifo"],
            100.0 * share_of_gain(jct["fifo"], jct["srtf"], jct["gittins"]),
            100.0 * share_of_gain(jct["fifo"], jct["srtf"], jct["dlas"]),
            100.0 * share_of_gain(jct["fifo"], jct["srtf"], jct["las"]),
        )
    };
    let uniform_line = bound_line(&mean_jct, &bound);
    let heavy_line = bound_line(&heavy_jct, &heavy_bound);
    let _ = writeln!(text, "1/5/10-minute trace: {uniform_line}");
    let _ = writeln!(text, "heavy-tailed trace:  {heavy_line}");
    Ok(Report { text, files })
}

/// (FIFO - x) / (FIFO - SRTF): how much of SRTF's gain over FIFO `x` gets.
fn share_of_gain(fifo: f64, srtf: f64, x: f64) -> f64 {
    (fifo - x) / (fifo - srtf)
}

/// SRTF told every job's exact length (run time alone) as its `seconds` hint:
/// the offline reference a policy without hints is measured against. The
/// generated traces already carry exact lengths, so there it equals `srtf`;
/// it is recomputed so a trace with missing or wrong hints still gets it.
/// `policy` on one device of `capacity` bytes, lanes by `lane_rule`.
fn one_device(policy: &str, capacity: u64, lane_rule: LaneRule) -> SimConfig {
    SimConfig {
        capacity: Some(capacity),
        lane_rule,
        ..SimConfig::new(policy)
    }
}

fn offline_bound(
    jobs: &[TraceJob],
    table: &WorkloadTable,
    capacity: u64,
    lane_rule: LaneRule,
) -> Result<Summary, SimError> {
    let mut exact = jobs.to_vec();
    for job in &mut exact {
        job.duration_s = Some(job.iterations as f64 * table.get(&job.model)?.iteration_s);
    }
    let config = one_device("srtf", capacity, lane_rule);
    let mut summary = Summary::of(&simulate(&exact, table, &config)?);
    summary.policy = OFFLINE_BOUND.into();
    Ok(summary)
}

/// The training trace's Salus policies under each lane rule, side by side.
const LANE_RULE_POLICIES: &[&str] = &["fifo", "srtf", "pack"];

/// (a') The training trace of (a) under both lane rules.
fn training_lane_rules(
    table: &WorkloadTable,
    seed: u64,
    capacity: u64,
) -> Result<(String, String), SimError> {
    let jobs = trace::generate(
        &training_spec(seed),
        table,
    )?;
    let mut text = format!(
        "lane rules on the same trace (salus | pack):\n{:<8} {:>21} {:>21} {:>21} {:>15} {:>9}\n",
        "policy", "makespan s", "mean JCT s", "p95 JCT s", "util %", "lanes"
    );
    let mut csv = String::from("lane_rule,") + &summary_header();
    for policy in LANE_RULE_POLICIES {
        let mut by_rule = Vec::new();
        for rule in LaneRule::ALL {
            let config = one_device(policy, capacity, rule);
            let summary = Summary::of(&simulate(&jobs, table, &config)?);
            csv.push_str(rule.name());
            csv.push(',');
            summary_row(&mut csv, &summary);
            by_rule.push(summary);
        }
        let [salus, pack] = [&by_rule[0], &by_rule[1]];
        let _ = writeln!(
            text,
            "{:<8} {:>10.0} | {:<8.0} {:>10.0} | {:<8.0} {:>10.0} | {:<8.0} {:>6.1} | {:<6.1} {:>3} | {:<3}",
            policy,
            salus.makespan_s,
            pack.makespan_s,
            salus.mean_jct_s,
            pack.mean_jct_s,
            salus.p95_jct_s,
            pack.p95_jct_s,
            salus.mean_utilization * 100.0,
            pack.mean_utilization * 100.0,
            salus.max_lanes,
            pack.max_lanes
        );
    }
    Ok((text, csv))
}

/// The models of the hyper-parameter experiment: small enough that several fit
/// one device, as the paper's tuning jobs did.
pub const HYPERPARAM_MODELS: &[&str] = &["resnet50_25", "googlenet_25", "alexnet_25"];
const HYPERPARAM_JOBS: usize = 300;

/// (b) 300 identical 1-minute jobs of one model, all submitted at once:
/// Salus (pack policy, memory lanes under each lane rule) against exclusive
/// use, per model.
fn hyperparam(table: &WorkloadTable, capacity: u64) -> Result<Report, SimError> {
    let mut text = format!(
        "(b) hyper-parameter tuning: {HYPERPARAM_JOBS} identical 1-minute jobs per model, all at t = 0, one {} GiB device; \
         Salus (pack policy) under each lane rule\n\
         {:<14} {:>5} {:>11} {:>10} {:>10} {:>9} {:>10} {:>9} {:>11} {:>10} {:>11} {:>10}\n",
        capacity >> 30,
        "model",
        "util",
        "excl span s",
        "span salus",
        "span pack",
        "util excl",
        "util salus",
        "util pack",
        "ratio salus",
        "ratio pack",
        "lanes salus",
        "lanes pack"
    );
    let mut csv = String::from(
        "model,exclusive_makespan_s,salus_makespan_s,exclusive_utilization,salus_utilization,ratio,max_lanes,\
         pack_makespan_s,pack_utilization,pack_ratio,pack_max_lanes\n",
    );
    let mut files = Vec::new();
    for model in HYPERPARAM_MODELS {
        let w = table.get(model)?;
        let iterations = ((60.0 / w.iteration_s).round() as u64).max(1);
        let jobs: Vec<TraceJob> = (0..HYPERPARAM_JOBS)
            .map(|i| TraceJob {
                job_id: format!("{model}-{i}"),
                model: model.to_string(),
                iterations,
                submit_s: 0.0,
                duration_s: Some(iterations as f64 * w.iteration_s),
                user: None,
                name: None,
                past_s: Vec::new(),
            })
            .collect();
        let run = |policy: &str, lane_rule: LaneRule| -> Result<(Summary, String), SimError> {
            let config = one_device(policy, capacity, lane_rule);
            let result = simulate(&jobs, table, &config)?;
            Ok((Summary::of(&result), timeline_csv(&result.timeline, 500)))
        };
        let (exclusive, _) = run("exclusive", LaneRule::Salus)?;
        let (salus, timeline) = run("pack", LaneRule::Salus)?;
        let (pack, pack_timeline) = run("pack", LaneRule::Pack)?;
        let ratio = exclusive.makespan_s / salus.makespan_s;
        let pack_ratio = exclusive.makespan_s / pack.makespan_s;
        let _ = writeln!(
            text,
            "{:<14} {:>5.2} {:>11.0} {:>10.0} {:>10.0} {:>8.1}% {:>9.1}% {:>8.1}% {:>10.2}x {:>9.2}x {:>11} {:>10}",
            model,
            w.utilization,
            exclusive.makespan_s,
            salus.makespan_s,
            pack.makespan_s,
            exclusive.mean_utilization * 100.0,
            salus.mean_utilization * 100.0,
            pack.mean_utilization * 100.0,
            ratio,
            pack_ratio,
            salus.max_lanes,
            pack.max_lanes
        );
        let _ = writeln!(
            csv,
            "{model},{:.3},{:.3},{:.4},{:.4},{ratio:.4},{},{:.3},{:.4},{pack_ratio:.4},{}",
            exclusive.makespan_s,
            salus.makespan_s,
            exclusive.mean_utilization,
            salus.mean_utilization,
            salus.max_lanes,
            pack.makespan_s,
            pack.mean_utilization,
            pack.max_lanes
        );
        files.push((format!("hyperparam_timeline_{model}.csv"), timeline));
        files.push((
            format!("hyperparam_timeline_{model}_pack.csv"),
            pack_timeline,
        ));
    }
    let _ = writeln!(
        text,
        "ratio = exclusive makespan / Salus makespan = utilization gain (paper: 2.38x)"
    );
    files.push(("hyperparam_summary.csv".into(), csv));
    Ok(Report { text, files })
}

pub const INFERENCE_INSTANCES: usize = 3;

/// The 14 inference configurations: every model at its smallest batch, and the
/// three smallest models again at their next batch size (the data has 11
/// models; the paper had 14).
fn inference_configs(table: &WorkloadTable) -> Vec<String> {
    let mut by_model: std::collections::BTreeMap<&str, Vec<(u64, &str)>> = Default::default();
    for name in table.models.keys() {
        if let Some((model, batch)) = name.rsplit_once('_') {
            if let Ok(batch) = batch.parse::<u64>() {
                by_model.entry(model).or_default().push((batch, name));
            }
        }
    }
    let mut configs: Vec<String> = Vec::new();
    let mut seconds: Vec<(u64, String)> = Vec::new();
    for batches in by_model.values_mut() {
        batches.sort();
        configs.push(batches[0].1.to_string());
        if let Some(next) = batches.get(1) {
            let w = &table.models[batches[0].1];
            seconds.push((w.persistent_bytes, next.1.to_string()));
        }
    }
    seconds.sort();
    configs.extend(seconds.into_iter().take(3).map(|(_, name)| name));
    configs
}

/// How an inference job's per-iteration memory is derived from the training
/// step's (the data has no inference measurements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InferenceMemory {
    /// Batches of the configuration's size, forward pass only: a third of the
    /// training step's ephemeral memory (training also keeps activations for
    /// the backward pass and holds gradients).
    Batched,
    /// Single requests: the training step's ephemeral memory / batch size.
    SingleRequest,
}

/// Inference memory of a training configuration: the same weights
/// (persistent), and the ephemeral memory by `model`.
fn inference_need(
    table: &WorkloadTable,
    config: &str,
    model: InferenceMemory,
) -> Result<MemoryNeed, SimError> {
    let w = table.get(config)?;
    let batch: u64 = config
        .rsplit_once('_')
        .and_then(|(_, b)| b.parse().ok())
        .filter(|b| *b > 0)
        .ok_or_else(|| SimError::Invalid(format!("{config}: no batch size in the name")))?;
    let ephemeral = match model {
        InferenceMemory::Batched => w.ephemeral_bytes / 3,
        InferenceMemory::SingleRequest => w.ephemeral_bytes / batch,
    };
    Ok(MemoryNeed {
        persistent: w.persistent_bytes,
        ephemeral,
    })
}

/// Devices needed when each job goes to the first device that admits it.
fn first_fit(needs: &[MemoryNeed], mut fits: impl FnMut(&mut Vec<Device>, usize) -> bool) -> usize {
    let mut devices: Vec<Device> = Vec::new();
    for i in 0..needs.len() {
        if !fits(&mut devices, i) {
            return usize::MAX;
        }
    }
    devices.len()
}

enum Device {
    Salus(Box<LaneManager>),
    Mps(u64),
}

/// Devices needed per rule: each lane rule, the one-lane bound, MPS, exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DevicesNeeded {
    salus: usize,
    pack: usize,
    one_lane: usize,
    mps: usize,
    exclusive: usize,
}

/// Devices needed when each device is a lane manager under `rule` and a job
/// goes to the first device that places it (jobs never leave).
fn lane_devices(needs: &[MemoryNeed], capacity: u64, rule: LaneRule) -> usize {
    first_fit(needs, |devices, i| {
        let id = JobId(i as u64);
        for device in devices.iter_mut() {
            if let Device::Salus(lanes) = device {
                // Resident inference services, idle between requests: no lane is busy.
                lanes.set_busy_lanes([]);
                match lanes.request(id, needs[i]) {
                    Ok(Placement::Placed(_)) => return true,
                    Ok(Placement::Waiting) => {
                        lanes.release(id);
                    }
                    Err(_) => return false,
                }
            }
        }
        let mut lanes = LaneManager::with_rule(capacity, rule);
        let placed = matches!(lanes.request(id, needs[i]), Ok(Placement::Placed(_)));
        devices.push(Device::Salus(Box::new(lanes)));
        placed
    })
}

/// Devices needed for `needs` under both lane rules, the sum(P) + max(E)
/// bound (each device one lane), the MPS rule and exclusively.
fn devices_needed(needs: &[MemoryNeed], capacity: u64) -> DevicesNeeded {
    let salus = lane_devices(needs, capacity, LaneRule::Salus);
    let pack = lane_devices(needs, capacity, LaneRule::Pack);
    // MPS: every job holds persistent + ephemeral at once.
    let mps = first_fit(needs, |devices, i| {
        let limit = needs[i].limit();
        for device in devices.iter_mut() {
            if let Device::Mps(used) = device {
                if *used + limit <= capacity {
                    *used += limit;
                    return true;
                }
            }
        }
        devices.push(Device::Mps(limit));
        limit <= capacity
    });
    // The rule's bound: all of a device's jobs in one lane.
    let mut one_lane: Vec<(u64, u64)> = Vec::new();
    for need in needs {
        let fits = |(p, e): &(u64, u64)| p + need.persistent + need.ephemeral.max(*e) <= capacity;
        match one_lane.iter_mut().find(|d| fits(d)) {
            Some((p, e)) => {
                *p += need.persistent;
                *e = (*e).max(need.ephemeral);
            }
            None => one_lane.push((need.persistent, need.ephemeral)),
        }
    }
    DevicesNeeded {
        salus,
        pack,
        one_lane: one_lane.len(),
        mps,
        exclusive: needs.len(),
    }
}

/// (c) How many devices 14 x 3 inference jobs need.
fn inference(table: &WorkloadTable, capacity: u64) -> Result<Report, SimError> {
    let configs = inference_configs(table);
    let mut text = format!(
        "(c) inference: {} models x {INFERENCE_INSTANCES} instances on {} GiB devices \
         (E: batched forward pass = training E / 3; E1: single requests = training E / batch)\n\
         {:<16} {:>10} {:>10} {:>10}\n",
        configs.len(),
        capacity >> 30,
        "model",
        "P MiB",
        "E MiB",
        "E1 MiB"
    );
    let mut csv = String::from("memory,rule,devices\n");
    let mut needs = [Vec::new(), Vec::new()];
    for config in &configs {
        let batched = inference_need(table, config, InferenceMemory::Batched)?;
        let single = inference_need(table, config, InferenceMemory::SingleRequest)?;
        let _ = writeln!(
            text,
            "{:<16} {:>10.1} {:>10.1} {:>10.1}",
            config,
            batched.persistent as f64 / MIB,
            batched.ephemeral as f64 / MIB,
            single.ephemeral as f64 / MIB
        );
        needs[0].extend(std::iter::repeat_n(batched, INFERENCE_INSTANCES));
        needs[1].extend(std::iter::repeat_n(single, INFERENCE_INSTANCES));
    }
    for (label, needs) in [("batched", &needs[0]), ("single-request", &needs[1])] {
        let d = devices_needed(needs, capacity);
        let _ = writeln!(
            text,
            "{label:<15} devices needed: lanes salus {}, lanes pack {}, one lane per device {}, MPS {}, exclusive {} \
             (paper: Salus 1, MPS 6, exclusive 42); pack: {:.1}x more jobs per device than exclusive, {:.1}x than MPS \
             (paper: 42x, 7x)",
            d.salus,
            d.pack,
            d.one_lane,
            d.mps,
            d.exclusive,
            d.exclusive as f64 / d.pack as f64,
            d.mps as f64 / d.pack as f64
        );
        for (rule, n) in [
            ("salus", d.salus),
            ("pack", d.pack),
            ("salus_one_lane", d.one_lane),
            ("mps", d.mps),
            ("exclusive", d.exclusive),
        ] {
            let _ = writeln!(csv, "{label},{rule},{n}");
        }
    }
    Ok(Report {
        text,
        files: vec![("inference_summary.csv".into(), csv)],
    })
}

/// (d) Users: who gets the device when one user has one job and another has
/// eight. The model and users; lengths are run time alone.
pub const USERS_MODEL: &str = "resnet50_25";
pub const USERS_POLICY: &str = "fair";
const SOLO_MINUTES: f64 = 60.0;
const CROWD_JOBS: usize = 8;
const CROWD_MINUTES: (f64, f64) = (6.0, 12.0);
const LATE_JOBS: usize = 3;
const LATE_MINUTES: (f64, f64) = (2.0, 4.0);
const LATE_ARRIVAL_S: f64 = 1200.0;
/// The users, in the order printed.
pub const USERS: [&str; 3] = ["solo", "crowd", "late"];

/// The users trace: `solo` one long job and `crowd` eight shorter ones at
/// t = 0, `late` three short ones at 1200 s; lengths drawn uniformly from
/// their ranges with `seed`. Long enough that, shared by jobs, no crowd job
/// ends before `late` arrives (8 jobs of >= 6 min at 1/9 of the device each
/// take >= 54 min), so the first interval is solo and crowd with all their
/// jobs.
pub fn users_trace(table: &WorkloadTable, seed: u64) -> Result<Vec<TraceJob>, SimError> {
    let w = table.get(USERS_MODEL)?;
    let mut rng = Rng::new(seed);
    let mut jobs = Vec::new();
    let mut add = |id: String, user: &str, minutes: f64, submit_s: f64| {
        let iterations = ((minutes * 60.0 / w.iteration_s).round() as u64).max(1);
        jobs.push(TraceJob {
            job_id: id,
            model: USERS_MODEL.to_string(),
            iterations,
            submit_s,
            duration_s: Some(iterations as f64 * w.iteration_s),
            user: Some(user.to_string()),
            name: None,
            past_s: Vec::new(),
        });
    };
    let mut draw = |(lo, hi): (f64, f64)| lo + (hi - lo) * rng.unit();
    add("solo-0".into(), "solo", SOLO_MINUTES, 0.0);
    for i in 0..CROWD_JOBS {
        add(format!("crowd-{i}"), "crowd", draw(CROWD_MINUTES), 0.0);
    }
    for i in 0..LATE_JOBS {
        add(
            format!("late-{i}"),
            "late",
            draw(LATE_MINUTES),
            LATE_ARRIVAL_S,
        );
    }
    Ok(jobs)
}

/// One share mode's run of the users trace.
pub struct UsersRun {
    pub share: Share,
    pub result: SimResult,
    /// Intervals in which the same users had work.
    pub intervals: Vec<UserInterval>,
}

impl UsersRun {
    /// The index of `name` in the result's users.
    pub fn user(&self, name: &str) -> usize {
        self.result
            .users
            .iter()
            .position(|u| u.name.as_deref() == Some(name))
            .expect("a user of the trace")
    }

    /// The first interval in which exactly `names` had work.
    pub fn interval_of(&self, names: &[&str]) -> Option<&UserInterval> {
        self.intervals.iter().find(|i| {
            let busy: Vec<usize> = i.busy_users().collect();
            busy.len() == names.len() && names.iter().all(|n| busy.contains(&self.user(n)))
        })
    }
}

/// The users trace on one lane (no memory limit: time-shared, so a user's
/// device time is the lane's time spent on its iterations) under `fair`,
/// shared by tenants and by jobs.
pub fn users_runs(
    table: &WorkloadTable,
    seed: u64,
) -> Result<(Vec<TraceJob>, Vec<UsersRun>), SimError> {
    let jobs = users_trace(table, seed)?;
    let mut runs = Vec::new();
    for share in [Share::Tenants, Share::Jobs] {
        let config = SimConfig::new(USERS_POLICY).with_share(share);
        let result = simulate(&jobs, table, &config)?;
        let intervals = user_intervals(&result);
        runs.push(UsersRun {
            share,
            result,
            intervals,
        });
    }
    Ok((jobs, runs))
}

/// (d) Users: the users trace shared by tenants and by jobs, side by side.
///
/// Device time per user is compared over intervals in which the same users
/// have work throughout (from their first job's start-up done to their last
/// job's end). Over the whole run every user gets exactly the device time its
/// jobs need, whatever the sharing, so whole-run totals say nothing about
/// shares; within an interval where both have work, a user's device time is
/// its share.
fn users(table: &WorkloadTable, seed: u64) -> Result<Report, SimError> {
    let (jobs, runs) = users_runs(table, seed)?;
    let mut text = format!(
        "(d) users: one lane (no memory limit; --capacity does not apply), policy {USERS_POLICY}, \
         model {USERS_MODEL}, seed {seed}\n\
         solo: 1 job of {SOLO_MINUTES:.0} min at t = 0; crowd: {CROWD_JOBS} jobs of {}-{} min at t = 0; \
         late: {LATE_JOBS} jobs of {}-{} min at t = {LATE_ARRIVAL_S:.0} s (lengths alone, drawn with the seed)\n\
         device time per user in each interval in which the same users have work (from a job's start-up \
         done to its user's last job's end);\n\
         over the whole run every user gets the device time its jobs need whatever the sharing, so only \
         an interval in which all the users compared have work shows their shares\n\
         {:<8} {:>15} {:<16} {:>17} {:>17} {:>17} {:>8}\n",
        CROWD_MINUTES.0,
        CROWD_MINUTES.1,
        LATE_MINUTES.0,
        LATE_MINUTES.1,
        "share",
        "interval s",
        "users with work",
        "solo s (%)",
        "crowd s (%)",
        "late s (%)",
        "max/min"
    );
    let mut csv = String::from("share,start_s,end_s,user,busy,device_s,device_share\n");
    let mut files = vec![("users_trace.csv".to_string(), trace::to_csv(&jobs))];
    for run in &runs {
        for interval in &run.intervals {
            let busy: Vec<&str> = USERS
                .iter()
                .copied()
                .filter(|n| interval.busy[run.user(n)])
                .collect();
            let cells: Vec<String> = USERS
                .iter()
                .map(|n| {
                    let u = run.user(n);
                    if interval.busy[u] {
                        format!(
                            "{:.0} ({:.1}%)",
                            interval.device_s[u],
                            100.0 * interval.share(u)
                        )
                    } else {
                        "-".into()
                    }
                })
                .collect();
            let _ = writeln!(
                text,
                "{:<8} {:>15} {:<16} {:>17} {:>17} {:>17} {:>8}",
                run.share.name(),
                format!("{:.0}-{:.0}", interval.start_s, interval.end_s),
                busy.join(","),
                cells[0],
                cells[1],
                cells[2],
                interval
                    .max_min_ratio()
                    .map_or("-".into(), |r| format!("{r:.2}"))
            );
            for n in USERS {
                let u = run.user(n);
                let _ = writeln!(
                    csv,
                    "{},{:.3},{:.3},{n},{},{:.3},{:.4}",
                    run.share.name(),
                    interval.start_s,
                    interval.end_s,
                    interval.busy[u],
                    interval.device_s[u],
                    interval.share(u)
                );
            }
        }
        files.push((
            format!("users_jobs_{}.csv", run.share.name()),
            jobs_csv(&run.result),
        ));
    }
    // The headline: the first interval, solo and crowd with all their jobs.
    let pair = ["solo", "crowd"];
    let mut headline = String::from("solo and crowd alone with all their jobs:");
    for run in &runs {
        if let Some(interval) = run.interval_of(&pair) {
            let _ = write!(
                headline,
                " share={} crowd {:.1}% of the device, max/min {:.2};",
                run.share.name(),
                100.0 * interval.share(run.user("crowd")),
                interval.max_min_ratio().unwrap_or(1.0)
            );
        }
    }
    let _ = writeln!(
        text,
        "{} (8 jobs of 9: {:.1}%)",
        headline.trim_end_matches(';'),
        800.0 / 9.0
    );
    let _ = writeln!(
        text,
        "\n{:<9} {:>6} {:>10} {:>14} {:>14}",
        "user", "jobs", "alone s", "mean JCT s", "mean JCT s"
    );
    let _ = writeln!(
        text,
        "{:<9} {:>6} {:>10} {:>14} {:>14}",
        "", "", "", "tenants", "jobs"
    );
    let means: Vec<Vec<Option<f64>>> = runs.iter().map(|r| user_mean_jct(&r.result)).collect();
    for n in USERS {
        let mine: Vec<&TraceJob> = jobs
            .iter()
            .filter(|j| j.user.as_deref() == Some(n))
            .collect();
        let work: f64 = mine.iter().filter_map(|j| j.duration_s).sum();
        let mean = |k: usize| means[k][runs[k].user(n)].map_or("-".into(), |s| format!("{s:.0}"));
        let _ = writeln!(
            text,
            "{:<9} {:>6} {:>10.0} {:>14} {:>14}",
            n,
            mine.len(),
            work,
            mean(0),
            mean(1)
        );
    }
    let _ = writeln!(
        text,
        "\n{:<9} {:<6} {:>10} {:>14} {:>14}",
        "job", "user", "alone s", "JCT s tenants", "JCT s jobs"
    );
    for (i, job) in jobs.iter().enumerate() {
        let jct = |k: usize| {
            runs[k].result.jobs[i]
                .jct_s()
                .map_or("-".into(), |s| format!("{s:.0}"))
        };
        let _ = writeln!(
            text,
            "{:<9} {:<6} {:>10.0} {:>14} {:>14}",
            job.job_id,
            job.user.as_deref().unwrap_or("-"),
            job.duration_s.unwrap_or(0.0),
            jct(0),
            jct(1)
        );
    }
    files.push(("users_intervals.csv".into(), csv));
    Ok(Report { text, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVAL_TABLE: &str = include_str!("../../eval/workloads.csv");

    #[test]
    fn users_share_the_device_by_user_under_tenants_and_by_job_under_jobs() {
        let table = WorkloadTable::parse(EVAL_TABLE).unwrap();
        for seed in 1..=3 {
            let (jobs, runs) = users_runs(&table, seed).unwrap();
            let [tenants, by_job] = &runs[..] else {
                panic!("two runs")
            };
            assert_eq!((tenants.share, by_job.share), (Share::Tenants, Share::Jobs));
            // Two saturated users: within 10% of each other by tenant.
            let pair = tenants.interval_of(&["solo", "crowd"]).unwrap();
            let ratio = pair.max_min_ratio().unwrap();
            assert!(ratio <= 1.1, "seed {seed}: tenants max/min {ratio}");
            // Long enough to mean something: 20 minutes.
            assert!(pair.end_s - pair.start_s > 1000.0, "{pair:?}");
            // Three: a third each.
            let three = tenants.interval_of(&USERS).unwrap();
            for n in USERS {
                let share = three.share(tenants.user(n));
                assert!((share - 1.0 / 3.0).abs() < 0.02, "seed {seed}: {n} {share}");
            }
            // By job: the crowd's eight jobs get 8/9.
            let pair = by_job.interval_of(&["solo", "crowd"]).unwrap();
            let crowd = pair.share(by_job.user("crowd"));
            assert!(
                (crowd - 8.0 / 9.0).abs() < 0.02,
                "seed {seed}: crowd {crowd}"
            );
            assert!(pair.max_min_ratio().unwrap() > 7.0);
            // Over the whole run each user gets its work's device time either
            // way (so whole-run totals compare nothing).
            for n in USERS {
                let work: f64 = jobs
                    .iter()
                    .filter(|j| j.user.as_deref() == Some(n))
                    .map(|j| j.duration_s.unwrap())
                    .sum();
                for run in &runs {
                    let got = run.result.users[run.user(n)].device_s;
                    assert!((got - work).abs() < 1e-3 * work, "{n}: {got} vs {work}");
                }
            }
            // The lone user's job ends sooner by tenant, the crowd's later.
            let mean = |run: &UsersRun, n: &str| user_mean_jct(&run.result)[run.user(n)].unwrap();
            assert!(mean(tenants, "solo") < mean(by_job, "solo"));
            assert!(mean(tenants, "crowd") > mean(by_job, "crowd"));
        }
        let report = users(&table, 1).unwrap();
        assert!(
            report.text.contains("share=jobs crowd 88.9% of the device"),
            "{}",
            report.text
        );
        let names: Vec<&str> = report.files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "users_trace.csv",
                "users_jobs_tenants.csv",
                "users_jobs_jobs.csv",
                "users_intervals.csv"
            ]
        );
    }

    #[test]
    fn pack_reaches_the_one_lane_bound_where_salus_fragments() {
        // 8 GiB devices. Four (1 + 1) jobs open four lanes of 2 and fill the pool;
        // a (1 + 2) job fits no lane's growth under Salus (needs a second device),
        // while merged lanes hold 4 + 1 + 2 = 7 <= 8.
        let small = MemoryNeed {
            persistent: 1 << 30,
            ephemeral: 1 << 30,
        };
        let large = MemoryNeed {
            persistent: 1 << 30,
            ephemeral: 2 << 30,
        };
        let needs = [small, small, small, small, large];
        let d = devices_needed(&needs, 8 << 30);
        assert_eq!(
            (d.salus, d.pack, d.one_lane, d.mps, d.exclusive),
            (2, 1, 1, 2, 5)
        );
    }

    #[test]
    fn inference_counts_devices_by_each_rule() {
        // 3 configs of P 4 GiB / E 2 GiB-per-request-batch-1, on 16 GiB devices.
        let table =
            WorkloadTable::parse("model,iteration_s,persistent_mb,ephemeral_mb\nm_1,1,4096,2048\n")
                .unwrap();
        let report = inference(&table, 16 << 30).unwrap();
        // 3 instances of (4 + 2): Salus 4 + 4 + 4 + 2 = 14 <= 16 -> 1; MPS 6 + 6 = 12, 18 > 16 -> 2.
        assert!(
            report
                .text
                .contains("lanes salus 1, lanes pack 1, one lane per device 1, MPS 2, exclusive 3"),
            "{}",
            report.text
        );
    }
}
