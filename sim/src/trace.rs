//! Traces: which jobs arrive when.
//!
//! CSV columns: `job_id,model,iterations,submit_time_s,duration_s,user`. `model`
//! names a row of the workload table; `duration_s` (optional) is the job's
//! expected run time alone, handed to the scheduler as the job's
//! `seconds=` hint (as a user would for SRTF); empty means no hint. `user`
//! (optional column, optional value) names the job's owner: the scheduler
//! shares a lane between users first (`salus_sched::tenants`); empty or
//! absent means no user (the core's `TenantId::NONE`, one tenant like any
//! other).
//!
//! Recurring work (optional columns): `name` names the script a job runs;
//! with its user and model it is the job's identity
//! ([`salus_sched::JobIdentity`]: tenant = user, fingerprint = model), whose
//! runs the scheduler's history follows, so `learned` ranks a resubmitted
//! job by its earlier runs. `past_s` lists runs of the job's identity that
//! completed before the trace began, device seconds separated by `;`
//! (`310.5;295`), oldest first: the history the trace starts with. Give it
//! once per identity, on any one of its rows (a separate history file,
//! `salus-sim run --history`, does the same for whole stores).

use std::fmt::Write as _;

use crate::rng::Rng;
use crate::workload::WorkloadTable;
use crate::{csv, SimError};

#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    pub job_id: String,
    pub model: String,
    pub iterations: u64,
    pub submit_s: f64,
    pub duration_s: Option<f64>,
    /// The job's owner; None: no user.
    pub user: Option<String>,
    /// The script it runs (its identity with user and model); None: a job
    /// the history does not follow.
    pub name: Option<String>,
    /// Runs of its identity that completed before the trace, device
    /// seconds, oldest first.
    pub past_s: Vec<f64>,
}

impl TraceJob {
    /// Who the job is for the scheduler's history: None without a name.
    pub fn identity(&self) -> Option<salus_sched::JobIdentity> {
        let name = self.name.as_deref()?;
        Some(salus_sched::JobIdentity::new(
            self.user.as_deref().unwrap_or(""),
            name,
            Some(&self.model),
        ))
    }
}

/// Whether `name` may name a script: 1 to
/// [`salus_sched::history::MAX_FIELD_LEN`] printable characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= salus_sched::history::MAX_FIELD_LEN
        && !name.chars().any(char::is_control)
}

/// Parses a `past_s` field: `;`-separated device seconds, each > 0.
fn parse_past(text: &str) -> Option<Vec<f64>> {
    text.split(';')
        .map(|s| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
        })
        .collect()
}

/// The longest user name a trace may hold.
pub const MAX_USER_LEN: usize = 64;

/// Whether `name` may name a user: 1 to [`MAX_USER_LEN`] ASCII letters,
/// digits, `_`, `-`, `.` or `@` (a login, an e-mail address, a team).
pub fn valid_user(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_USER_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'))
}

/// The distinct users of `jobs`, sorted by name.
pub fn users(jobs: &[TraceJob]) -> Vec<String> {
    let names: std::collections::BTreeSet<&str> =
        jobs.iter().filter_map(|j| j.user.as_deref()).collect();
    names.into_iter().map(String::from).collect()
}

pub fn parse(text: &str) -> Result<Vec<TraceJob>, SimError> {
    let rows = csv::parse(text, &["job_id", "model", "iterations", "submit_time_s"])?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        let job_id = row.get("job_id")?.to_string();
        if !seen.insert(job_id.clone()) {
            return Err(SimError::Csv {
                line: row.line,
                why: format!("job_id {job_id:?} appears twice"),
            });
        }
        let iterations = row.number("iterations")?;
        if iterations < 1.0 || iterations.fract() != 0.0 {
            return Err(SimError::Csv {
                line: row.line,
                why: format!("job {job_id:?}: iterations must be a whole number >= 1"),
            });
        }
        let user = row.optional("user");
        if let Some(name) = user.filter(|name| !valid_user(name)) {
            return Err(SimError::Csv {
                line: row.line,
                why: format!(
                    "job {job_id:?}: user {name:?} is not a user name (1 to {MAX_USER_LEN} letters, \
                     digits, '_', '-', '.' or '@'; empty: no user)"
                ),
            });
        }
        let name = row.optional("name");
        if let Some(bad) = name.filter(|name| !valid_name(name)) {
            return Err(SimError::Csv {
                line: row.line,
                why: format!(
                    "job {job_id:?}: name {bad:?} is not a script name (1 to {} printable characters)",
                    salus_sched::history::MAX_FIELD_LEN
                ),
            });
        }
        let past_s = match row.optional("past_s") {
            None => Vec::new(),
            Some(_) if name.is_none() => {
                return Err(SimError::Csv {
                    line: row.line,
                    why: format!(
                    "job {job_id:?}: past_s without a name (earlier runs belong to a named script)"
                ),
                })
            }
            Some(text) => parse_past(text).ok_or_else(|| SimError::Csv {
                line: row.line,
                why: format!(
                    "job {job_id:?}: past_s {text:?} is not device seconds > 0 separated by ';'"
                ),
            })?,
        };
        let job = TraceJob {
            job_id,
            model: row.get("model")?.to_string(),
            iterations: iterations as u64,
            submit_s: row.number("submit_time_s")?,
            duration_s: row.optional_number("duration_s")?,
            user: user.map(String::from),
            name: name.map(String::from),
            past_s,
        };
        if !job.past_s.is_empty() {
            let identity = job.identity();
            if let Some(earlier) = jobs
                .iter()
                .find(|j: &&TraceJob| !j.past_s.is_empty() && j.identity() == identity)
            {
                return Err(SimError::Csv {
                    line: row.line,
                    why: format!(
                        "job {:?}: past_s of its script was already given (job {:?}); give it once per script",
                        job.job_id, earlier.job_id
                    ),
                });
            }
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// The history a trace starts with: its `past_s` runs, completed, added to
/// `history` (an empty one, or one read from a history file).
pub fn seed_history(jobs: &[TraceJob], history: &mut salus_sched::History) {
    for job in jobs {
        let Some(identity) = job.identity() else {
            continue;
        };
        for &device_s in &job.past_s {
            history.record(
                &identity,
                salus_sched::history::PastRun {
                    device_s,
                    iterations: 0,
                    end: salus_sched::RunEnd::Completed,
                },
            );
        }
    }
}

/// The trace as CSV; the `user`, `name` and `past_s` columns only when some
/// job has one, so a trace without them reads as it did before they existed.
pub fn to_csv(jobs: &[TraceJob]) -> String {
    let with_users = jobs.iter().any(|j| j.user.is_some());
    let with_names = jobs.iter().any(|j| j.name.is_some());
    let with_past = jobs.iter().any(|j| !j.past_s.is_empty());
    let mut out = String::from("job_id,model,iterations,submit_time_s,duration_s");
    if with_users {
        out.push_str(",user");
    }
    if with_names {
        out.push_str(",name");
    }
    if with_past {
        out.push_str(",past_s");
    }
    out.push('\n');
    for j in jobs {
        let duration = j.duration_s.map(|d| format!("{d:.3}")).unwrap_or_default();
        let _ = write!(
            out,
            "{},{},{},{:.3},{}",
            j.job_id, j.model, j.iterations, j.submit_s, duration
        );
        if with_users {
            let _ = write!(out, ",{}", j.user.as_deref().unwrap_or(""));
        }
        if with_names {
            let _ = write!(out, ",{}", j.name.as_deref().unwrap_or(""));
        }
        if with_past {
            let past: Vec<String> = j.past_s.iter().map(|s| format!("{s:.3}")).collect();
            let _ = write!(out, ",{}", past.join(";"));
        }
        out.push('\n');
    }
    out
}

/// What [`generate`] draws from.
#[derive(Clone, Debug)]
pub struct TraceSpec {
    pub jobs: usize,
    pub seed: u64,
    /// Mean seconds between arrivals (Poisson process); 0: all at once.
    pub mean_interarrival_s: f64,
    /// Models to draw from, uniformly; empty: every model of the table.
    pub models: Vec<String>,
    /// Job lengths to draw from, uniformly, in minutes of run time alone (the
    /// original traces' 1, 5 and 10 minute jobs).
    pub minutes: Vec<f64>,
}

/// How [`generate_with`] draws job lengths (run time alone).
#[derive(Clone, Debug, PartialEq)]
pub enum JobLengths {
    /// One of these minutes, uniformly (the original traces' 1, 5, 10).
    Choice(Vec<f64>),
    /// Log-normal: most jobs short, a few very long, as in production GPU
    /// clusters (docs/EVALUATION.md, section (a), says which parameters and
    /// why). `sigma` is the standard deviation of ln(length); lengths are
    /// capped at `max_minutes`.
    LogNormal {
        median_minutes: f64,
        sigma: f64,
        max_minutes: f64,
    },
}

/// The heavy-tailed lengths of the training experiment. The spread
/// (sigma 2: the 99th percentile about 100x the median) follows the
/// production traces; the median is scaled so the mean, about 5.3 minutes,
/// equals that of the 1/5/10-minute trace, so both traces bring the same
/// load and differ only in their spread.
pub const HEAVY_TAIL_MEDIAN_MINUTES: f64 = 0.72;
pub const HEAVY_TAIL_SIGMA: f64 = 2.0;
/// Keeps one freak draw from dominating a 100-job trace (about 1 in 10^5
/// draws reaches it).
pub const HEAVY_TAIL_MAX_MINUTES: f64 = 600.0;

impl JobLengths {
    pub fn heavy_tailed() -> JobLengths {
        JobLengths::LogNormal {
            median_minutes: HEAVY_TAIL_MEDIAN_MINUTES,
            sigma: HEAVY_TAIL_SIGMA,
            max_minutes: HEAVY_TAIL_MAX_MINUTES,
        }
    }

    pub(crate) fn check(&self) -> Result<(), SimError> {
        let valid = match self {
            JobLengths::Choice(minutes) => {
                !minutes.is_empty() && minutes.iter().all(|m| *m > 0.0 && m.is_finite())
            }
            JobLengths::LogNormal {
                median_minutes,
                sigma,
                max_minutes,
            } => {
                *median_minutes > 0.0
                    && median_minutes.is_finite()
                    && *sigma >= 0.0
                    && sigma.is_finite()
                    && *max_minutes > 0.0
            }
        };
        if valid {
            Ok(())
        } else {
            Err(SimError::Invalid(format!(
                "job lengths must be positive minutes (sigma >= 0): {self:?}"
            )))
        }
    }

    pub(crate) fn draw(&self, rng: &mut Rng) -> f64 {
        match self {
            JobLengths::Choice(minutes) => minutes[rng.below(minutes.len())],
            JobLengths::LogNormal {
                median_minutes,
                sigma,
                max_minutes,
            } => {
                // Box-Muller: a standard normal from two uniforms.
                let (u1, u2) = (rng.unit(), rng.unit());
                let normal = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (median_minutes * (sigma * normal).exp()).min(*max_minutes)
            }
        }
    }
}

/// A seedable trace: Poisson arrivals, models and lengths drawn uniformly.
pub fn generate(spec: &TraceSpec, table: &WorkloadTable) -> Result<Vec<TraceJob>, SimError> {
    generate_with(spec, &JobLengths::Choice(spec.minutes.clone()), table)
}

/// As [`generate`], with lengths drawn from `lengths` instead of
/// `spec.minutes`.
pub fn generate_with(
    spec: &TraceSpec,
    lengths: &JobLengths,
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
    let mut rng = Rng::new(spec.seed);
    let mut now = 0.0;
    let mut jobs = Vec::with_capacity(spec.jobs);
    for i in 0..spec.jobs {
        if i > 0 && spec.mean_interarrival_s > 0.0 {
            now += rng.exponential(spec.mean_interarrival_s);
        }
        let model = models[rng.below(models.len())];
        let workload = table.get(model)?;
        let minutes = lengths.draw(&mut rng);
        let iterations = ((minutes * 60.0 / workload.iteration_s).round() as u64).max(1);
        jobs.push(TraceJob {
            job_id: format!("j{i}"),
            model: model.to_string(),
            iterations,
            submit_s: now,
            duration_s: Some(iterations as f64 * workload.iteration_s),
            user: None,
            name: None,
            past_s: Vec::new(),
        });
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> WorkloadTable {
        WorkloadTable::parse("model,iteration_s,persistent_mb,ephemeral_mb\na,0.5,1,1\nb,2,1,1\n")
            .unwrap()
    }

    #[test]
    fn parses_checks_and_round_trips() {
        let jobs =
            parse("job_id,model,iterations,submit_time_s,duration_s\nx,a,10,0,\ny,b,3,1.5,6\n")
                .unwrap();
        assert_eq!(jobs[0].duration_s, None);
        assert_eq!(jobs[1].duration_s, Some(6.0));
        assert_eq!(parse(&to_csv(&jobs)).unwrap(), jobs);
        for bad in ["x,a,0,0,", "x,a,1.5,0,", "x,a,1,-1,"] {
            let text = format!("job_id,model,iterations,submit_time_s,duration_s\n{bad}\n");
            assert!(parse(&text).is_err(), "{bad}");
        }
        let twice = "job_id,model,iterations,submit_time_s\nx,a,1,0\nx,a,1,0\n";
        assert!(parse(twice).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn the_user_column_is_optional_and_old_traces_parse_as_before() {
        // No user column: as before users existed, and written back the same.
        let old =
            "job_id,model,iterations,submit_time_s,duration_s\nx,a,10,0.000,\ny,b,3,1.500,6.000\n";
        let jobs = parse(old).unwrap();
        assert!(jobs.iter().all(|j| j.user.is_none()));
        assert_eq!(to_csv(&jobs), old);
        assert!(users(&jobs).is_empty());
        // The column in any place; empty: no user.
        let text = "user,job_id,model,iterations,submit_time_s\nbob,x,a,1,0\n,y,a,1,0\nalice@lab,z,a,1,0\nbob,w,a,1,0\n";
        let jobs = parse(text).unwrap();
        let owners: Vec<_> = jobs.iter().map(|j| j.user.as_deref()).collect();
        assert_eq!(owners, [Some("bob"), None, Some("alice@lab"), Some("bob")]);
        assert_eq!(users(&jobs), ["alice@lab", "bob"]);
        let written = to_csv(&jobs);
        assert!(written.starts_with("job_id,model,iterations,submit_time_s,duration_s,user\n"));
        assert!(written.contains("\ny,a,1,0.000,,\n"), "{written}");
        assert_eq!(parse(&written).unwrap(), jobs);
    }

    #[test]
    fn bad_user_names_are_errors_naming_the_line_and_job() {
        let long = "u".repeat(MAX_USER_LEN + 1);
        for bad in ["a b", "bob;rm", "b\u{e9}b", long.as_str()] {
            let text = format!(
                "job_id,model,iterations,submit_time_s,user\nx,a,1,0,ok\n\ny,a,1,0,{bad}\n"
            );
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.contains("line 4")
                    && err.contains("job \"y\"")
                    && err.contains(&format!("{bad:?}")),
                "{bad}: {err}"
            );
        }
        assert!(valid_user(&"u".repeat(MAX_USER_LEN)) && valid_user("team-a.b_c@x"));
        // A row short of the user column is the usual field-count error.
        let err = parse("job_id,model,iterations,submit_time_s,user\nx,a,1,0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("4 fields"), "{err}");
    }

    #[test]
    fn names_and_past_runs_parse_with_clear_errors() {
        let text = "job_id,model,iterations,submit_time_s,user,name,past_s\n\
                    x,a,10,0,bob,train.py,60;61.5\ny,a,10,1,bob,train.py,\nz,b,1,2,,,\n";
        let jobs = parse(text).unwrap();
        assert_eq!(jobs[0].past_s, [60.0, 61.5]);
        assert_eq!(jobs[0].identity(), jobs[1].identity());
        assert_eq!(
            jobs[0].identity().unwrap(),
            salus_sched::JobIdentity::new("bob", "train.py", Some("a"))
        );
        assert_eq!(jobs[2].identity(), None);
        let mut history = salus_sched::History::default();
        seed_history(&jobs, &mut history);
        assert_eq!(history.runs(&jobs[0].identity().unwrap()).len(), 2);
        assert_eq!(parse(&to_csv(&jobs)).unwrap(), jobs);
        let header = "job_id,model,iterations,submit_time_s,name,past_s\n";
        for (row, words) in [
            ("x,a,1,0,,5", "past_s without a name"),
            ("x,a,1,0,s,5;-1", "not device seconds"),
            ("x,a,1,0,s,5;;6", "not device seconds"),
        ] {
            let err = parse(&format!("{header}{row}\n")).unwrap_err().to_string();
            assert!(
                err.contains("line 2") && err.contains(words),
                "{row}: {err}"
            );
        }
        let twice = format!("{header}x,a,1,0,s,5\ny,a,1,0,s,6\n");
        let err = parse(&twice).unwrap_err().to_string();
        assert!(
            err.contains("line 3") && err.contains("once per script"),
            "{err}"
        );
    }

    #[test]
    fn generation_is_seeded_and_sized_by_minutes() {
        let spec = TraceSpec {
            jobs: 50,
            seed: 3,
            mean_interarrival_s: 10.0,
            models: vec![],
            minutes: vec![1.0],
        };
        let a = generate(&spec, &table()).unwrap();
        assert_eq!(a, generate(&spec, &table()).unwrap());
        assert_eq!(a.len(), 50);
        assert!(a.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
        for job in &a {
            let expected = if job.model == "a" { 120 } else { 30 };
            assert_eq!(job.iterations, expected);
            assert_eq!(job.duration_s, Some(60.0));
        }
        assert!(a.iter().any(|j| j.model == "a") && a.iter().any(|j| j.model == "b"));
    }

    #[test]
    fn heavy_tailed_lengths_are_seeded_mostly_short_and_capped() {
        let spec = TraceSpec {
            jobs: 4000,
            seed: 5,
            mean_interarrival_s: 10.0,
            models: vec!["a".into()],
            minutes: vec![],
        };
        let lengths = JobLengths::LogNormal {
            median_minutes: 1.0,
            sigma: 2.0,
            max_minutes: 100.0,
        };
        let jobs = generate_with(&spec, &lengths, &table()).unwrap();
        assert_eq!(jobs, generate_with(&spec, &lengths, &table()).unwrap());
        let mut minutes: Vec<f64> = jobs.iter().map(|j| j.duration_s.unwrap() / 60.0).collect();
        minutes.sort_by(f64::total_cmp);
        let at = |q: f64| minutes[(q * minutes.len() as f64) as usize];
        // Log-normal quantiles: median e^0, 90th e^(2 x 1.28) = 13 x median.
        assert!((0.85..1.15).contains(&at(0.5)), "median {}", at(0.5));
        assert!((9.0..17.0).contains(&at(0.9)), "p90 {}", at(0.9));
        assert!(*minutes.last().unwrap() <= 100.0);
        assert!(
            minutes.iter().filter(|&&m| m == 100.0).count() > 0,
            "the cap binds"
        );
        for bad in [
            JobLengths::Choice(vec![]),
            JobLengths::Choice(vec![-1.0]),
            JobLengths::LogNormal {
                median_minutes: 0.0,
                sigma: 1.0,
                max_minutes: 10.0,
            },
        ] {
            assert!(generate_with(&spec, &bad, &table()).is_err(), "{bad:?}");
        }
    }
}
