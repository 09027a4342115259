//! Recurring traces: jobs that rerun the same scripts, as in production GPU
//! clusters, for the `learned` policy (`salus-sim gen-trace --recurring`).
//!
//! A trace's job is either a rerun of a script that already ran in the
//! trace ([`Recurrence::resubmit_share`] of jobs, the script drawn uniformly
//! among those seen) or a new script, with a model drawn uniformly and a base
//! length drawn from the trace's length law. A run's length is its script's
//! base times e^(noise x N(0,1)) ([`Recurrence::noise_sigma`]). A new script
//! ran before the trace with probability [`Recurrence::history_share`]: 1 to
//! [`Recurrence::max_past_runs`] runs, drawn the same way, in its `past_s`.
//!
//! The defaults, and where they come from (docs/EVALUATION.md, section (e)):
//! - resubmission 0.6: the analysis of Alibaba's PAI 2020 trace (Weng et
//!   al., NSDI'22) finds that most jobs recur, which is why SJF on lengths
//!   predicted from the user's and group's earlier jobs gets 96% of SJF's
//!   gain over FIFO there; 0.6 assumes somewhat less recurrence.
//! - base lengths: whatever law the trace is given; the `learning`
//!   experiment uses the heavy-tailed law of Philly-like clusters (Jeon et
//!   al., ATC'19: most jobs minutes, a few days), median 8 min, sigma 1.6.
//! - noise 0.5: 3Sigma (Park et al., EuroSys'18) finds point predictions from
//!   past runs 2x off for 8-23% of jobs; a log-normal error is 2x off for 15%
//!   of jobs at sigma ln 2 / 1.44 = 0.48.
//! - pre-trace history 0.5, up to 5 runs: a trace is a window of a cluster's
//!   life, and scripts that recur within it mostly ran before it too; half is
//!   the cautious middle.

use crate::rng::Rng;
use crate::trace::{JobLengths, TraceJob, TraceSpec};
use crate::workload::WorkloadTable;
use crate::SimError;

/// How a recurring trace repeats its scripts.
#[derive(Clone, Debug, PartialEq)]
pub struct Recurrence {
    /// Share of jobs that rerun a script seen earlier in the trace.
    pub resubmit_share: f64,
    /// Standard deviation of ln(run length / script's base length).
    pub noise_sigma: f64,
    /// Share of new scripts that ran before the trace.
    pub history_share: f64,
    /// Most runs a script has before the trace.
    pub max_past_runs: usize,
}

pub const RESUBMIT_SHARE: f64 = 0.6;
pub const NOISE_SIGMA: f64 = 0.5;
pub const HISTORY_SHARE: f64 = 0.5;
pub const MAX_PAST_RUNS: usize = 5;

impl Default for Recurrence {
    fn default() -> Self {
        Recurrence {
            resubmit_share: RESUBMIT_SHARE,
            noise_sigma: NOISE_SIGMA,
            history_share: HISTORY_SHARE,
            max_past_runs: MAX_PAST_RUNS,
        }
    }
}

impl Recurrence {
    fn check(&self) -> Result<(), SimError> {
        let share = |v: f64| (0.0..=1.0).contains(&v);
        if share(self.resubmit_share)
            && share(self.history_share)
            && self.noise_sigma >= 0.0
            && self.noise_sigma.is_finite()
        {
            Ok(())
        } else {
            Err(SimError::Invalid(format!(
                "recurrence shares must be 0 to 1 and the noise a number >= 0: {self:?}"
            )))
        }
    }
}

struct Script {
    name: String,
    model: String,
    iteration_s: f64,
    base_s: f64,
}

/// A seeded recurring trace: Poisson arrivals as [`crate::trace::generate_with`],
/// base lengths from `lengths`, scripts repeated by `recurrence`.
pub fn generate(
    spec: &TraceSpec,
    lengths: &JobLengths,
    recurrence: &Recurrence,
    table: &WorkloadTable,
) -> Result<Vec<TraceJob>, SimError> {
    let models: Vec<&str> = if spec.models.is_empty() {
        table.models.keys().map(String::as_str).collect()
    } else {
        spec.models.iter().map(String::as_str).collect()
    };
    if models.is_empty() || lengths == &JobLengths::Choice(vec![]) {
        return Err(SimError::Invalid(
            "a trace needs at least one model and one job length".into(),
        ));
    }
    lengths.check()?;
    recurrence.check()?;
    let mut rng = Rng::new(spec.seed);
    let mut scripts: Vec<Script> = Vec::new();
    let mut now = 0.0;
    let mut jobs = Vec::with_capacity(spec.jobs);
    for i in 0..spec.jobs {
        if i > 0 && spec.mean_interarrival_s > 0.0 {
            now += rng.exponential(spec.mean_interarrival_s);
        }
        let rerun = !scripts.is_empty() && rng.unit() < recurrence.resubmit_share;
        let mut past_s = Vec::new();
        let script = if rerun {
            rng.below(scripts.len())
        } else {
            let model = models[rng.below(models.len())];
            let script = Script {
                name: format!("script{}", scripts.len()),
                model: model.to_string(),
                iteration_s: table.get(model)?.iteration_s,
                base_s: lengths.draw(&mut rng) * 60.0,
            };
            if rng.unit() < recurrence.history_share && recurrence.max_past_runs > 0 {
                let runs = 1 + rng.below(recurrence.max_past_runs);
                past_s = (0..runs)
                    .map(|_| run_length(&script, recurrence, &mut rng))
                    .collect();
            }
            scripts.push(script);
            scripts.len() - 1
        };
        let script = &scripts[script];
        let length_s = run_length(script, recurrence, &mut rng);
        let iterations = ((length_s / script.iteration_s).round() as u64).max(1);
        jobs.push(TraceJob {
            job_id: format!("j{i}"),
            model: script.model.clone(),
            iterations,
            submit_s: now,
            duration_s: Some(iterations as f64 * script.iteration_s),
            user: None,
            name: Some(script.name.clone()),
            past_s,
        });
    }
    Ok(jobs)
}

/// One run of `script`: its base length with log-normal noise, at least one
/// iteration.
fn run_length(script: &Script, recurrence: &Recurrence, rng: &mut Rng) -> f64 {
    let noisy = script.base_s * (recurrence.noise_sigma * rng.normal()).exp();
    noisy.max(script.iteration_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> WorkloadTable {
        WorkloadTable::parse("model,iteration_s,persistent_mb,ephemeral_mb\na,0.5,1,1\nb,2,1,1\n")
            .unwrap()
    }

    fn spec(jobs: usize, seed: u64) -> TraceSpec {
        TraceSpec {
            jobs,
            seed,
            mean_interarrival_s: 10.0,
            models: vec![],
            minutes: vec![],
        }
    }

    #[test]
    fn scripts_recur_with_noise_around_their_base_and_some_have_a_past() {
        let lengths = JobLengths::heavy_tailed();
        let jobs = generate(&spec(2000, 4), &lengths, &Recurrence::default(), &table()).unwrap();
        assert_eq!(
            jobs,
            generate(&spec(2000, 4), &lengths, &Recurrence::default(), &table()).unwrap()
        );
        let mut by_name: std::collections::HashMap<&str, Vec<&TraceJob>> = Default::default();
        for job in &jobs {
            by_name
                .entry(job.name.as_deref().unwrap())
                .or_default()
                .push(job);
        }
        // About 40% of jobs start a script.
        let scripts = by_name.len() as f64 / jobs.len() as f64;
        assert!((0.35..0.45).contains(&scripts), "{scripts}");
        // A script keeps its model; runs spread around their log-mean by about the noise.
        let mut deviations = Vec::new();
        for runs in by_name.values().filter(|r| r.len() >= 3) {
            assert!(runs.iter().all(|r| r.model == runs[0].model));
            let logs: Vec<f64> = runs.iter().map(|r| r.duration_s.unwrap().ln()).collect();
            let mean = logs.iter().sum::<f64>() / logs.len() as f64;
            deviations.extend(logs.iter().map(|l| (l - mean).powi(2)));
        }
        let sigma = (deviations.iter().sum::<f64>() / deviations.len() as f64).sqrt();
        assert!((0.35..0.6).contains(&sigma), "{sigma}");
        // About half of the scripts ran before, only on a script's first row.
        let with_past = by_name.values().filter(|r| !r[0].past_s.is_empty()).count();
        let share = with_past as f64 / by_name.len() as f64;
        assert!((0.4..0.6).contains(&share), "{share}");
        assert!(by_name
            .values()
            .all(|r| r[1..].iter().all(|j| j.past_s.is_empty())));
        assert!(by_name.values().all(|r| r[0].past_s.len() <= MAX_PAST_RUNS));
        // The CSV round-trips with its name and past_s columns.
        let back = crate::trace::parse(&crate::trace::to_csv(&jobs)).unwrap();
        assert_eq!(back.len(), jobs.len());
        assert_eq!(back[0].name, jobs[0].name);
        assert_eq!(
            back.iter().filter(|j| !j.past_s.is_empty()).count(),
            with_past
        );
    }

    #[test]
    fn bad_recurrence_is_an_error() {
        let bad = Recurrence {
            resubmit_share: 1.5,
            ..Recurrence::default()
        };
        assert!(generate(&spec(10, 1), &JobLengths::heavy_tailed(), &bad, &table()).is_err());
    }
}
