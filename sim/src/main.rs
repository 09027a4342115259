//! `salus-sim`: runs traces through Salus's scheduler core in virtual time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use salus_sched::lanes::LaneRule;
use salus_sched::units::parse_size;
use salus_sched::Share;
use salus_sim::engine::{parse_weight, simulate, SimConfig, Stepping};
use salus_sched::policy::population::Estimator;
use salus_sim::experiments::{self, Experiment};
use salus_sim::recurring::{self, Recurrence};
use salus_sim::report::{jobs_csv, timeline_csv, users_json, users_text, Summary};
use salus_sim::trace::{self, JobLengths, TraceSpec};
use salus_sim::workload::{derive_from_salus, WorkloadTable};

#[derive(Parser)]
#[command(
    name = "salus-sim",
    version,
    about = "Trace-driven simulator of Salus: the server's own scheduler and lane manager in virtual time. \
             See docs/EVALUATION.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a trace under one policy and print a summary.
    Run {
        /// Trace CSV: job_id,model,iterations,submit_time_s,duration_s[,user][,name][,past_s]
        /// (user: the job's owner; name: the script it runs; past_s: its
        /// script's runs before the trace, seconds separated by ';').
        #[arg(long)]
        trace: PathBuf,
        /// Workload table CSV: model,iteration_s,persistent_mb,ephemeral_mb[,utilization,startup_s].
        #[arg(long)]
        workloads: PathBuf,
        /// fifo, srtf, pack, fair, rr, priority, las, dlas, gittins, learned, or a baseline: exclusive, mps.
        #[arg(long, default_value = "pack")]
        policy: String,
        /// Job history the scheduler starts with (the server's text form,
        /// `salus-history 1`); the trace's past_s are added to it.
        #[arg(long)]
        history: Option<PathBuf>,
        /// Jobs give no length hints (no iterations or seconds): policies
        /// must learn lengths, as `learned` does from history.
        #[arg(long)]
        no_length_hints: bool,
        /// How `learned` estimates the law of jobs without history:
        /// censored (the server's), censored+prior, empirical or lognormal-fit.
        #[arg(long, default_value = "censored", value_parser = parse_estimator)]
        estimator: Estimator,
        /// Device memory, e.g. 16GiB: memory lanes (Salus) or admission (mps). Unset: one lane, no limit.
        #[arg(long, value_parser = parse_size)]
        capacity: Option<u64>,
        /// Share of speed lost when activities share a saturated device.
        #[arg(long, default_value_t = 0.1)]
        interference: f64,
        /// Lane rule when the pool does not hold a new lane (with --capacity):
        /// salus (join the first lane that can grow, else wait) or pack (join the
        /// best-fitting lane, else merge lanes, else wait).
        #[arg(long, default_value_t = LaneRule::default())]
        lane_rule: LaneRule,
        /// Who a lane is shared between first: tenants (equal device time,
        /// by weight, between the trace's users with work; the policy orders
        /// each user's own jobs) or jobs (the policy orders every job).
        #[arg(long, default_value_t = Share::default())]
        share: Share,
        /// A user's weight, USER=W (W 1 to 1000, default 1): its share of
        /// device time against the others' under --share tenants. Repeatable.
        #[arg(long = "weight", value_name = "USER=W", value_parser = parse_weight)]
        weights: Vec<(String, u32)>,
        /// Write per-job results (job_id,model,arrival_s,start_s,end_s,jct_s,lane).
        #[arg(long)]
        jobs_out: Option<PathBuf>,
        /// Write utilization, lanes and running jobs over time (500 steps).
        #[arg(long)]
        timeline_out: Option<PathBuf>,
        /// Print the summary as one JSON object (with "users" and
        /// "intervals" for a trace that names users).
        #[arg(long)]
        json: bool,
    },
    /// Generate a seeded trace: Poisson arrivals, models drawn uniformly, lengths
    /// uniform over --minutes or heavy-tailed (--lengths lognormal).
    GenTrace {
        #[arg(long)]
        workloads: PathBuf,
        #[arg(long, default_value_t = 100)]
        jobs: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Mean seconds between arrivals (0: all at once).
        #[arg(long, default_value_t = 30.0)]
        mean_interarrival: f64,
        /// Models to draw from (comma separated); default: every model of the table.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// Job lengths alone, in minutes, drawn uniformly (--lengths uniform).
        #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
        minutes: Vec<f64>,
        /// uniform (over --minutes) or lognormal (heavy-tailed: --median-minutes, --sigma, --max-minutes).
        #[arg(long, value_enum, default_value = "uniform")]
        lengths: LengthDistribution,
        /// lognormal: median job length alone, in minutes.
        #[arg(long, default_value_t = trace::HEAVY_TAIL_MEDIAN_MINUTES)]
        median_minutes: f64,
        /// lognormal: standard deviation of ln(length).
        #[arg(long, default_value_t = trace::HEAVY_TAIL_SIGMA)]
        sigma: f64,
        /// lognormal: longest job, in minutes.
        #[arg(long, default_value_t = trace::HEAVY_TAIL_MAX_MINUTES)]
        max_minutes: f64,
        /// Recurring work: jobs rerun scripts (name and past_s columns).
        #[arg(long)]
        recurring: bool,
        /// --recurring: share of jobs that rerun a script seen earlier in the trace.
        #[arg(long, default_value_t = recurring::RESUBMIT_SHARE)]
        resubmit_share: f64,
        /// --recurring: standard deviation of ln(run length / script's base length).
        #[arg(long, default_value_t = recurring::NOISE_SIGMA)]
        noise_sigma: f64,
        /// --recurring: share of new scripts with runs before the trace (past_s).
        #[arg(long, default_value_t = recurring::HISTORY_SHARE)]
        history_share: f64,
        /// --recurring: most runs a script has before the trace.
        #[arg(long, default_value_t = recurring::MAX_PAST_RUNS)]
        max_past_runs: usize,
        /// Output file (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Derive the workload table from Salus's measurements (shared/data/salus_workloads.csv).
    Workloads {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// One of the paper's experiments (or `users`, this project's): prints a
    /// table, writes CSVs for plots.
    Experiment {
        #[arg(value_enum)]
        which: Experiment,
        #[arg(long)]
        workloads: PathBuf,
        /// Where the CSVs go.
        #[arg(long, default_value = "eval-out")]
        out_dir: PathBuf,
        /// Seed of the generated traces (training, users); learning: the
        /// first of its 8 seeds (1: seeds 1-8, 9: seeds 9-16).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// GPU memory of one device (users: not used, one lane).
        #[arg(long, value_parser = parse_size, default_value = "16GiB")]
        capacity: u64,
        /// Lane rule of the Salus runs (salus or pack); the lane-rule
        /// comparisons always show both (users: not used, one lane).
        #[arg(long, default_value_t = LaneRule::default())]
        lane_rule: LaneRule,
    },
    /// Time a large generated trace (default 10,000 jobs) under one policy;
    /// prints the wall time and the cost per scheduling decision.
    Scale {
        #[arg(long)]
        workloads: PathBuf,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        #[arg(long, default_value = "pack")]
        policy: String,
        #[arg(long, value_parser = parse_size, default_value = "16GiB")]
        capacity: u64,
        /// Mean seconds between arrivals.
        #[arg(long, default_value_t = 60.0)]
        mean_interarrival: f64,
        /// every-iteration: the scheduler decides each iteration boundary;
        /// fast-forward: a job alone on its lane continues without asking it
        /// (identical results).
        #[arg(long, value_enum, default_value_t = Stepping::default())]
        stepping: Stepping,
    },
}

/// `gen-trace --lengths`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LengthDistribution {
    Uniform,
    Lognormal,
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn table(path: &Path) -> Result<WorkloadTable, String> {
    WorkloadTable::parse(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

fn output(out: Option<&Path>, text: &str) -> Result<(), String> {
    match out {
        Some(path) => write(path, text),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

pub fn print_summary(s: &Summary) {
    println!(
        "{:<10} jobs {:>5} (refused {})  makespan {:>10.1} s  mean JCT {:>9.1} s  p95 JCT {:>9.1} s  utilization {:>5.1}%  max lanes {}",
        s.policy,
        s.jobs,
        s.refused,
        s.makespan_s,
        s.mean_jct_s,
        s.p95_jct_s,
        s.mean_utilization * 100.0,
        s.max_lanes
    );
}

fn main_inner(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Run {
            trace: trace_path,
            workloads,
            policy,
            history,
            no_length_hints,
            estimator,
            capacity,
            interference,
            lane_rule,
            share,
            weights,
            jobs_out,
            timeline_out,
            json,
        } => {
            let table = table(&workloads)?;
            let jobs = trace::parse(&read(&trace_path)?)
                .map_err(|e| format!("{}: {e}", trace_path.display()))?;
            let history = match history {
                Some(path) => Some(
                    salus_sched::History::parse(&read(&path)?)
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                ),
                None => None,
            };
            let config = SimConfig {
                capacity,
                interference,
                lane_rule,
                weights,
                length_hints: !no_length_hints,
                history,
                estimator,
                ..SimConfig::new(&policy).with_share(share)
            };
            let result = simulate(&jobs, &table, &config).map_err(|e| e.to_string())?;
            let summary = Summary::of(&result);
            if let Some(path) = jobs_out {
                write(&path, &jobs_csv(&result))?;
            }
            if let Some(path) = timeline_out {
                write(&path, &timeline_csv(&result.timeline, 500))?;
            }
            let named_users = result.users.iter().any(|u| u.name.is_some());
            if json {
                let mut out = summary.to_json();
                if named_users {
                    if let (Some(out), serde_json::Value::Object(users)) =
                        (out.as_object_mut(), users_json(&result))
                    {
                        out.extend(users);
                    }
                }
                println!("{out}");
            } else {
                print_summary(&summary);
                if named_users {
                    print!("{}", users_text(&result, 20));
                }
            }
            Ok(())
        }
        Command::GenTrace {
            workloads,
            jobs,
            seed,
            mean_interarrival,
            models,
            minutes,
            lengths,
            median_minutes,
            sigma,
            max_minutes,
            recurring,
            resubmit_share,
            noise_sigma,
            history_share,
            max_past_runs,
            out,
        } => {
            let lengths = match lengths {
                LengthDistribution::Uniform => JobLengths::Choice(minutes.clone()),
                LengthDistribution::Lognormal => JobLengths::LogNormal {
                    median_minutes,
                    sigma,
                    max_minutes,
                },
            };
            let spec = TraceSpec {
                jobs,
                seed,
                mean_interarrival_s: mean_interarrival,
                models,
                minutes,
            };
            let table = table(&workloads)?;
            let trace = if recurring {
                let recurrence = Recurrence {
                    resubmit_share,
                    noise_sigma,
                    history_share,
                    max_past_runs,
                };
                recurring::generate(&spec, &lengths, &recurrence, &table)
            } else {
                trace::generate_with(&spec, &lengths, &table)
            }
            .map_err(|e| e.to_string())?;
            output(out.as_deref(), &trace::to_csv(&trace))
        }
        Command::Workloads { from, out } => {
            let table =
                derive_from_salus(&read(&from)?).map_err(|e| format!("{}: {e}", from.display()))?;
            output(out.as_deref(), &table.to_csv())
        }
        Command::Experiment {
            which,
            workloads,
            out_dir,
            seed,
            capacity,
            lane_rule,
        } => {
            std::fs::create_dir_all(&out_dir)
                .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
            let report = experiments::run(which, &table(&workloads)?, seed, capacity, lane_rule)
                .map_err(|e| e.to_string())?;
            print!("{}", report.text);
            for (name, text) in &report.files {
                write(&out_dir.join(name), text)?;
            }
            println!(
                "wrote {} files to {}",
                report.files.len(),
                out_dir.display()
            );
            Ok(())
        }
        Command::Scale {
            workloads,
            jobs,
            policy,
            capacity,
            mean_interarrival,
            stepping,
        } => {
            let table = table(&workloads)?;
            let spec = TraceSpec {
                jobs,
                seed: 1,
                mean_interarrival_s: mean_interarrival,
                models: vec![],
                minutes: vec![1.0, 5.0, 10.0],
            };
            let trace = trace::generate(&spec, &table).map_err(|e| e.to_string())?;
            let config = SimConfig {
                capacity: Some(capacity),
                stepping,
                ..SimConfig::new(&policy)
            };
            let started = Instant::now();
            let result = simulate(&trace, &table, &config).map_err(|e| e.to_string())?;
            let elapsed = started.elapsed().as_secs_f64();
            print_summary(&Summary::of(&result));
            println!(
                "simulated {jobs} jobs ({} iterations, arrivals every {mean_interarrival} s on average) \
                 in {elapsed:.2} s (target <= 10 s: {})",
                result.iterations,
                if elapsed <= 10.0 { "met" } else { "MISSED" }
            );
            // Every iteration boundary is one decision, whether the scheduler
            // or the fast-forward made it; the wall time covers both, and the
            // lane manager's admissions besides.
            let decisions = result.iterations.max(1);
            println!(
                "cost per decision: {:.1} ns ({} decisions, {} by the scheduler, {} fast-forwarded)",
                elapsed * 1e9 / decisions as f64,
                result.iterations,
                result.iterations - result.fast_forwarded,
                result.fast_forwarded
            );
            Ok(())
        }
    }
}

fn parse_estimator(text: &str) -> Result<Estimator, String> {
    Estimator::ALL
        .into_iter()
        .find(|e| e.name() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = Estimator::ALL.iter().map(|e| e.name()).collect();
            format!("one of {}", names.join(", "))
        })
}

fn main() -> ExitCode {
    match main_inner(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("salus-sim: {err}");
            ExitCode::FAILURE
        }
    }
}
