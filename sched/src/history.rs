//! Job identities and the history of their runs, from which `learned` ranks.
//!
//! Real clusters resubmit the same work: one user runs one script again and
//! again, with similar lengths. A job's [`JobIdentity`] is its tenant, its
//! name and, where one exists, a fingerprint of its main iteration (the
//! graph's or function's hash), so the same script with another model does
//! not share a history. [`History`] keeps, per identity, the lengths of its
//! last runs (device seconds of work and iterations) and how each ended, and
//! fits a log-normal law to them ([`History::estimate`]): the median of the
//! identity's completed runs, and a spread learned online from how far each
//! new run fell from the median predicted before it (pooled over every
//! identity, as one identity rarely has enough runs to learn its own).
//!
//! The store is bounded: [`History::max_runs`] runs per identity (the
//! oldest go first) and [`History::max_identities`] identities (the least
//! recently run go first), of which [`MAX_IDENTITIES_PER_TENANT`] of one
//! tenant (a tenant beyond it loses its own least recently run first). It is plain in-memory state with a text form
//! ([`History::to_text`], [`History::parse`]) that the server keeps with its
//! other state and the simulator reads as a history file; a tenant's
//! identities can be erased at once ([`History::erase_tenant`]).

mod text;

use std::collections::HashMap;
use std::fmt;

use crate::law::LogNormal;
use crate::Nanos;

pub use text::HistoryFileError;

/// Runs kept per identity: enough for a stable median, few enough that a
/// script whose length changed is relearnt within a handful of runs.
pub const MAX_RUNS: usize = 16;

/// Identities kept; with [`MAX_RUNS`] each, about 5 MB of text at most.
pub const MAX_IDENTITIES: usize = 4096;

/// Identities kept of one tenant: a tenant that opens jobs under ever new
/// names (or models) displaces its own oldest identities, never the other
/// tenants' history.
pub const MAX_IDENTITIES_PER_TENANT: usize = 512;

/// Longest tenant, name or fingerprint kept, in bytes (longer ones are cut
/// at a character boundary): bounds the store whatever clients send.
pub const MAX_FIELD_LEN: usize = 256;

/// The spread assumed before any identity has run twice, and the weight (in
/// runs) of that assumption afterwards. 3Sigma (Park et al., EuroSys'18)
/// finds point predictions from past runs 2x off for 8-23% of jobs: for a
/// log-normal error, 2x off for 15% of jobs is a sigma of ln 2 / 1.44 = 0.48.
pub const PRIOR_SIGMA: f64 = 0.5;
pub const PRIOR_WEIGHT: f64 = 4.0;

/// The learnt spread follows about this many recent prediction errors.
pub const SPREAD_MEMORY: f64 = 256.0;

/// The spread is kept within the law's bounds.
pub use crate::law::{MAX_SIGMA, MIN_SIGMA};

/// Who runs what: runs of one identity are taken to be alike in length.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobIdentity {
    /// The tenant's durable name: the server writes its tenant key (`uid:N`,
    /// `name:TOKEN-TENANT`, `anonymous`; empty: no tenant).
    /// Not the scheduler's [`crate::TenantId`], which is a per-process number.
    pub tenant: String,
    /// The job's name (the script's, or the one its client gave).
    pub name: String,
    /// A hash of its main iteration, where one exists.
    pub fingerprint: Option<String>,
}

impl JobIdentity {
    /// An identity with every field cut to [`MAX_FIELD_LEN`]; an empty
    /// fingerprint is none.
    pub fn new(tenant: &str, name: &str, fingerprint: Option<&str>) -> JobIdentity {
        JobIdentity {
            tenant: cut(tenant).to_string(),
            name: cut(name).to_string(),
            fingerprint: fingerprint
                .filter(|f| !f.is_empty())
                .map(|f| cut(f).to_string()),
        }
    }
}

impl fmt::Display for JobIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.tenant.is_empty() {
            write!(f, "{}/", self.tenant)?;
        }
        f.write_str(&self.name)?;
        if let Some(fingerprint) = &self.fingerprint {
            write!(f, "#{fingerprint}")?;
        }
        Ok(())
    }
}

fn cut(text: &str) -> &str {
    if text.len() <= MAX_FIELD_LEN {
        return text;
    }
    let mut end = MAX_FIELD_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How a run ended. Only completed runs say how long the work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunEnd {
    /// The client finished and closed the job.
    Completed,
    /// It failed (an error, its process died).
    Failed,
    /// It was cancelled or evicted (an admin, a deadline, shutdown).
    Cancelled,
}

impl RunEnd {
    pub fn name(self) -> &'static str {
        match self {
            RunEnd::Completed => "completed",
            RunEnd::Failed => "failed",
            RunEnd::Cancelled => "cancelled",
        }
    }

    pub fn from_name(name: &str) -> Option<RunEnd> {
        [RunEnd::Completed, RunEnd::Failed, RunEnd::Cancelled]
            .into_iter()
            .find(|end| end.name() == name)
    }
}

/// One past run of an identity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PastRun {
    /// Device seconds of work (iterations at the job's unshared speed, see
    /// [`crate::policy::JobView::work`]).
    pub device_s: f64,
    pub iterations: u64,
    pub end: RunEnd,
}

/// What the history expects of an identity's next run, for status displays
/// ("expected 12 min from 7 earlier runs") and for `learned`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectation {
    /// The median of its completed runs, device seconds.
    pub median_s: f64,
    /// The spread of ln(length) the prediction carries.
    pub sigma: f64,
    /// Completed runs it rests on.
    pub runs: usize,
}

impl Expectation {
    /// The law `learned` ranks by.
    pub fn law(&self) -> Option<LogNormal> {
        LogNormal::new(self.median_s * 1e9, self.sigma)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Record {
    /// Oldest first.
    runs: Vec<PastRun>,
    /// When it last ran, on the store's own counter (for eviction).
    last_used: u64,
}

impl Record {
    fn completed_median_log(&self) -> Option<f64> {
        let mut logs: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.end == RunEnd::Completed && r.device_s > 0.0)
            .map(|r| r.device_s.ln())
            .collect();
        if logs.is_empty() {
            return None;
        }
        logs.sort_by(f64::total_cmp);
        let n = logs.len();
        Some(if n % 2 == 1 {
            logs[n / 2]
        } else {
            (logs[n / 2 - 1] + logs[n / 2]) / 2.0
        })
    }

    fn completed(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.end == RunEnd::Completed && r.device_s > 0.0)
            .count()
    }
}

/// Squared prediction errors of ln(length), decayed so recent ones count most.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// Decayed sum of squared errors.
    pub sum_sq: f64,
    /// Decayed count of errors.
    pub count: f64,
}

impl Spread {
    fn add(&mut self, error: f64) {
        let keep = 1.0 - 1.0 / SPREAD_MEMORY;
        self.sum_sq = self.sum_sq * keep + error * error;
        self.count = self.count * keep + 1.0;
    }

    /// The spread learnt so far, the prior weighing [`PRIOR_WEIGHT`] runs.
    pub fn sigma(&self) -> f64 {
        let var =
            (self.sum_sq + PRIOR_WEIGHT * PRIOR_SIGMA * PRIOR_SIGMA) / (self.count + PRIOR_WEIGHT);
        var.sqrt().clamp(MIN_SIGMA, MAX_SIGMA)
    }
}

/// The bounded store of past runs by identity.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    records: HashMap<JobIdentity, Record>,
    spread: Spread,
    clock: u64,
    max_runs: usize,
    max_identities: usize,
    max_per_tenant: usize,
}

impl Default for History {
    fn default() -> Self {
        History::with_limits(MAX_IDENTITIES, MAX_RUNS)
    }
}

impl History {
    /// A store of at most `max_identities` identities of `max_runs` runs each
    /// (each at least 1).
    pub fn with_limits(max_identities: usize, max_runs: usize) -> History {
        History {
            records: HashMap::new(),
            spread: Spread::default(),
            clock: 0,
            max_runs: max_runs.max(1),
            max_identities: max_identities.max(1),
            max_per_tenant: MAX_IDENTITIES_PER_TENANT.min(max_identities).max(1),
        }
    }

    /// The same store with at most `max` identities of one tenant (at least 1).
    pub fn with_tenant_limit(mut self, max: usize) -> History {
        self.max_per_tenant = max.max(1);
        self
    }

    pub fn max_runs(&self) -> usize {
        self.max_runs
    }

    pub fn max_identities(&self) -> usize {
        self.max_identities
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records a run of `identity`. A completed run first teaches the spread
    /// how far it fell from what the earlier runs predicted.
    pub fn record(&mut self, identity: &JobIdentity, run: PastRun) {
        if !(run.device_s.is_finite() && run.device_s >= 0.0) {
            return;
        }
        let identity = JobIdentity::new(
            &identity.tenant,
            &identity.name,
            identity.fingerprint.as_deref(),
        );
        self.clock += 1;
        if !self.records.contains_key(&identity) {
            let tenant = &identity.tenant;
            let of_tenant = self.records.keys().filter(|id| &id.tenant == tenant).count();
            if of_tenant >= self.max_per_tenant {
                self.evict_least_recent_of(Some(tenant.as_str()));
            } else if self.records.len() >= self.max_identities {
                self.evict_least_recent_of(None);
            }
        }
        let record = self.records.entry(identity).or_default();
        if run.end == RunEnd::Completed && run.device_s > 0.0 {
            if let Some(predicted) = record.completed_median_log() {
                self.spread.add(run.device_s.ln() - predicted);
            }
        }
        record.runs.push(run);
        if record.runs.len() > self.max_runs {
            let excess = record.runs.len() - self.max_runs;
            record.runs.drain(..excess);
        }
        record.last_used = self.clock;
    }

    /// Forgets the least recently run identity (of `tenant`, if named).
    fn evict_least_recent_of(&mut self, tenant: Option<&str>) {
        if let Some(oldest) = self
            .records
            .iter()
            .filter(|(id, _)| tenant.is_none_or(|t| id.tenant == t))
            .min_by_key(|(_, r)| r.last_used)
            .map(|(id, _)| id.clone())
        {
            self.records.remove(&oldest);
        }
    }

    /// The law of `identity`'s next run; None without a completed run.
    pub fn estimate(&self, identity: &JobIdentity) -> Option<Expectation> {
        let record = self.records.get(identity)?;
        let median_log = record.completed_median_log()?;
        Some(Expectation {
            median_s: median_log.exp(),
            sigma: self.spread.sigma(),
            runs: record.completed(),
        })
    }

    /// `identity`'s runs, oldest first.
    pub fn runs(&self, identity: &JobIdentity) -> &[PastRun] {
        self.records
            .get(identity)
            .map_or(&[], |record| record.runs.as_slice())
    }

    /// Every identity, least recently run first.
    pub fn identities(&self) -> Vec<&JobIdentity> {
        let mut ids: Vec<(&JobIdentity, u64)> = self
            .records
            .iter()
            .map(|(id, record)| (id, record.last_used))
            .collect();
        ids.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        ids.into_iter().map(|(id, _)| id).collect()
    }

    /// Completed runs' work, every identity, oldest first by identity: the
    /// population a policy falls back on for identities never seen.
    pub fn completed_work(&self) -> Vec<Nanos> {
        self.identities()
            .into_iter()
            .flat_map(|id| self.runs(id))
            .filter(|r| r.end == RunEnd::Completed && r.device_s > 0.0)
            .map(|r| (r.device_s * 1e9) as Nanos)
            .collect()
    }

    /// The learnt spread of ln(length) around an identity's median.
    pub fn spread(&self) -> Spread {
        self.spread
    }

    /// Gives every identity the tenant `rename` says (histories written with
    /// another naming of tenants); identities that become one keep their runs
    /// together, the oldest dropped beyond [`Self::max_runs`]. Returns how
    /// many identities changed.
    pub fn rename_tenants(&mut self, mut rename: impl FnMut(&str) -> String) -> usize {
        let mut changed = 0;
        let old = std::mem::take(&mut self.records);
        let mut ordered: Vec<(JobIdentity, Record)> = old.into_iter().collect();
        ordered.sort_by_key(|(_, r)| r.last_used);
        for (identity, record) in ordered {
            let tenant = rename(&identity.tenant);
            let identity = if tenant == identity.tenant {
                identity
            } else {
                changed += 1;
                JobIdentity::new(&tenant, &identity.name, identity.fingerprint.as_deref())
            };
            match self.records.get_mut(&identity) {
                Some(kept) => {
                    kept.runs.extend(record.runs);
                    let excess = kept.runs.len().saturating_sub(self.max_runs);
                    kept.runs.drain(..excess);
                    kept.last_used = kept.last_used.max(record.last_used);
                }
                None => {
                    self.records.insert(identity, record);
                }
            }
        }
        changed
    }

    /// Forgets every identity of `tenant` (its durable name); returns how
    /// many. The learnt spread is a statistic over everyone and stays.
    pub fn erase_tenant(&mut self, tenant: &str) -> usize {
        let before = self.records.len();
        self.records.retain(|id, _| id.tenant != tenant);
        before - self.records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tenant: &str, name: &str) -> JobIdentity {
        JobIdentity::new(tenant, name, None)
    }

    fn done(device_s: f64) -> PastRun {
        PastRun {
            device_s,
            iterations: 10,
            end: RunEnd::Completed,
        }
    }

    #[test]
    fn the_estimate_is_the_median_of_completed_runs() {
        let mut h = History::default();
        let train = id("alice", "train.py");
        assert_eq!(h.estimate(&train), None);
        for s in [100.0, 400.0, 200.0] {
            h.record(&train, done(s));
        }
        // A failed run says nothing about the length.
        h.record(
            &train,
            PastRun {
                device_s: 1.0,
                iterations: 1,
                end: RunEnd::Failed,
            },
        );
        let e = h.estimate(&train).unwrap();
        assert!((e.median_s - 200.0).abs() < 1e-9, "{e:?}");
        assert_eq!(e.runs, 3);
        assert_eq!(h.runs(&train).len(), 4);
        // Another fingerprint is another identity.
        assert_eq!(
            h.estimate(&JobIdentity::new("alice", "train.py", Some("g1"))),
            None
        );
    }

    #[test]
    fn the_spread_is_learnt_from_prediction_errors() {
        let mut h = History::default();
        assert!((h.spread().sigma() - PRIOR_SIGMA).abs() < 1e-12);
        // Exact repeats: the spread shrinks towards its floor.
        for k in 0..200 {
            let job = id("u", &format!("s{}", k % 10));
            h.record(&job, done(60.0));
        }
        assert!(h.spread().sigma() < 0.2, "{}", h.spread().sigma());
        // Runs that double and halve: the spread grows towards ln 2.
        let mut noisy = History::default();
        for k in 0..400 {
            let job = id("u", &format!("s{}", k % 10));
            noisy.record(&job, done(if k % 20 < 10 { 30.0 } else { 120.0 }));
        }
        let sigma = noisy.spread().sigma();
        assert!((0.5..1.5).contains(&sigma), "{sigma}");
    }

    #[test]
    fn the_store_is_bounded_in_runs_and_identities() {
        let mut h = History::with_limits(3, 4);
        let a = id("t", "a");
        for s in 1..=10 {
            h.record(&a, done(s as f64));
        }
        let kept: Vec<f64> = h.runs(&a).iter().map(|r| r.device_s).collect();
        assert_eq!(kept, [7.0, 8.0, 9.0, 10.0], "the newest runs stay");
        h.record(&id("t", "b"), done(1.0));
        h.record(&id("t", "c"), done(1.0));
        h.record(&a, done(11.0)); // a is now the most recent
        h.record(&id("t", "d"), done(1.0)); // evicts b, the least recent
        assert_eq!(h.len(), 3);
        assert!(h.runs(&id("t", "b")).is_empty());
        assert!(!h.runs(&a).is_empty());
        // Fields are cut to a bound, whatever a client sends.
        let long = JobIdentity::new("t", &"é".repeat(MAX_FIELD_LEN), None);
        assert!(long.name.len() <= MAX_FIELD_LEN);
    }

    #[test]
    fn renaming_tenants_moves_and_merges_identities() {
        let mut h = History::with_limits(100, 3);
        let run = |s: f64| PastRun { device_s: s, iterations: 1, end: RunEnd::Completed };
        h.record(&id("alice", "a"), run(1.0));
        h.record(&id("alice", "a"), run(2.0));
        h.record(&id("uid:7", "a"), run(3.0));
        h.record(&id("uid:7", "a"), run(4.0));
        h.record(&id("bob", "b"), run(5.0));
        let renamed = h.rename_tenants(|t| match t {
            "alice" => "uid:7".into(),
            "bob" => "name:bob".into(),
            other => other.into(),
        });
        assert_eq!(renamed, 2);
        assert_eq!(h.len(), 2);
        let merged: Vec<f64> = h.runs(&id("uid:7", "a")).iter().map(|r| r.device_s).collect();
        assert_eq!(merged.len(), 3);
        assert!(merged.contains(&4.0), "{merged:?}");
        assert_eq!(h.runs(&id("name:bob", "b")).len(), 1);
        assert!(h.runs(&id("alice", "a")).is_empty());
    }

    #[test]
    fn a_tenant_beyond_its_limit_displaces_its_own_identities_only() {
        let mut h = History::with_limits(6, 4).with_tenant_limit(3);
        h.record(&id("alice", "a"), done(1.0));
        h.record(&id("alice", "b"), done(1.0));
        for n in 0..100 {
            h.record(&id("mallory", &format!("job-{n}")), done(1.0));
        }
        assert_eq!(h.len(), 5, "alice's two and mallory's last three");
        assert!(!h.runs(&id("alice", "a")).is_empty() && !h.runs(&id("alice", "b")).is_empty());
        for n in 97..100 {
            assert!(!h.runs(&id("mallory", &format!("job-{n}"))).is_empty());
        }
        assert!(h.runs(&id("mallory", "job-96")).is_empty());
        // The store's own bound still holds across tenants.
        for t in ["bob", "carol", "dave"] {
            h.record(&id(t, "x"), done(1.0));
        }
        assert_eq!(h.len(), 6);
        assert_eq!(History::default().max_per_tenant, MAX_IDENTITIES_PER_TENANT);
    }

    #[test]
    fn erasing_a_tenant_forgets_only_its_identities() {
        let mut h = History::default();
        h.record(&id("alice", "a"), done(10.0));
        h.record(&id("alice", "b"), done(10.0));
        h.record(&id("bob", "a"), done(20.0));
        assert_eq!(h.erase_tenant("alice"), 2);
        assert_eq!(h.estimate(&id("alice", "a")), None);
        assert!(h.estimate(&id("bob", "a")).is_some());
        assert_eq!(h.erase_tenant("alice"), 0);
    }

    #[test]
    fn bad_runs_are_ignored() {
        let mut h = History::default();
        h.record(&id("t", "a"), done(f64::NAN));
        h.record(&id("t", "a"), done(-1.0));
        assert!(h.is_empty());
    }
}
