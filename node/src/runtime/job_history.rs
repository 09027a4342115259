//! Who each open job is, for the job history that `learned` ranks by, and the
//! history's file in the state directory.
//!
//! A job's identity ([`JobIdentity`]) is its tenant's key (`uid:N` for a Unix
//! user, `name:NAME` for a token tenant without one, `anonymous`: never the
//! display name, which a token tenant and a user may share), its own name (the
//! adapter's `SALUS_JOB_NAME`, a stock client's session-metadata name, the C
//! shim's) and a fingerprint of its main iteration: a hash of the names and op
//! types of the graph's nodes (graph jobs) or of the main function's nodes
//! (eager jobs), so the same script with another model keeps a history of its
//! own. The fingerprint is known at the job's first main iteration; until then
//! the job ranks by its tenant and name alone.
//!
//! The history lives in the process that schedules (the server, or the
//! supervisor under tenant isolation) and is saved to `history.json` in the
//! state directory after each run it records, by a thread of its own: a job's
//! end never waits for the disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::sched::{Expectation, History, JobId, JobIdentity, PastRun, RunEnd};
use crate::state_dir::{Loaded, StateDir, StateDocument};
use crate::tenant::identity::TenantKey;
use salus_proto::tensorflow::error::Code as TfCode;

/// The identities of the open jobs, by job.
#[derive(Default)]
pub struct JobIdentities {
    by_job: HashMap<JobId, JobIdentity>,
}

impl JobIdentities {
    /// `job` of `tenant` (its key text, `uid:N`, `name:NAME` or `anonymous`;
    /// "" for none) opened as `name`.
    pub fn open(&mut self, job: JobId, tenant: &str, name: &str) {
        self.by_job
            .insert(job, JobIdentity::new(tenant, name, None));
    }

    /// Adds the fingerprint of `job`'s main iteration; returns the identity
    /// it now has (None: a job not opened here).
    pub fn set_fingerprint(&mut self, job: JobId, fingerprint: &str) -> Option<JobIdentity> {
        let identity = self.by_job.get_mut(&job)?;
        *identity = JobIdentity::new(&identity.tenant, &identity.name, Some(fingerprint));
        Some(identity.clone())
    }

    pub fn get(&self, job: JobId) -> Option<&JobIdentity> {
        self.by_job.get(&job)
    }

    pub fn forget(&mut self, job: JobId) {
        self.by_job.remove(&job);
    }
}

/// The job history as the admin API shows it.
pub struct HistoryView {
    /// Identity, its runs (oldest first) and its estimate, by identity.
    pub identities: Vec<(JobIdentity, Vec<PastRun>, Option<Expectation>)>,
    pub max_identities: usize,
    pub max_runs: usize,
    /// Where it is saved (None: not saved).
    pub file: Option<PathBuf>,
}

/// A stable 64-bit hash of a main iteration's shape: the sum of FNV-1a hashes
/// of each node's name and op type, so the order the client sent the nodes
/// in (and a graph's split into deltas) does not matter. Not `std`'s hasher:
/// it is seeded per process, and fingerprints must match across restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShapeHash(u64);

impl ShapeHash {
    pub fn add_node(&mut self, name: &str, op: &str) {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes().chain([0]).chain(op.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = self.0.wrapping_add(hash);
    }

    pub fn merge(&mut self, other: ShapeHash) {
        self.0 = self.0.wrapping_add(other.0);
    }

    /// The fingerprint's text: `g` (a graph) or `f` (a function) and 16 hex digits.
    pub fn fingerprint(self, kind: char) -> String {
        format!("{kind}{:016x}", self.0)
    }
}

/// What a job's front end tells the history: its fingerprint once, at its
/// first main iteration, and how it ended, judged by its last main iteration
/// when its client closes it or goes away.
#[derive(Default)]
pub struct HistoryFacts {
    fingerprinted: AtomicBool,
    last_main_failed: AtomicBool,
}

impl HistoryFacts {
    /// True the first time only: the caller tells the executor the fingerprint.
    pub fn first_main(&self) -> bool {
        !self.fingerprinted.swap(true, Ordering::Relaxed)
    }

    /// A main iteration ended, with TensorFlow's `code` if it failed. The end
    /// of the input (OUT_OF_RANGE, how a dataset loop stops) is not a failure.
    pub fn main_ended(&self, failed: Option<TfCode>) {
        let failed = failed.is_some_and(|code| code != TfCode::OutOfRange);
        self.last_main_failed.store(failed, Ordering::Relaxed);
    }

    /// How the run ended when its client closed it or left: completed unless
    /// its last main iteration failed (the script stopped on an error).
    pub fn end_when_closed(&self) -> RunEnd {
        if self.last_main_failed.load(Ordering::Relaxed) {
            RunEnd::Failed
        } else {
            RunEnd::Completed
        }
    }
}

/// `history.json`: the history's text form, a line a string (see
/// `salus_sched::history` for the format).
#[derive(Serialize, Deserialize)]
pub struct SavedHistory {
    lines: Vec<String>,
}

impl StateDocument for SavedHistory {
    const FILE: &'static str = "history.json";
    const VERSION: u32 = 1;
    const WHAT: &'static str = "job history";
}

impl SavedHistory {
    pub fn of(history: &History) -> SavedHistory {
        SavedHistory {
            lines: history.to_text().lines().map(str::to_string).collect(),
        }
    }
}

/// Reads the saved history, if any. A file that is not a history is moved
/// aside with the reason logged, and the server starts with an empty one.
pub fn load_history(dir: &StateDir) -> Option<History> {
    let saved = match dir.load::<SavedHistory>() {
        Loaded::Missing => return None,
        Loaded::Restored(saved) => saved,
        Loaded::Dropped(dropped) => {
            tracing::error!(%dropped, "the job history could not be read; starting with none");
            return None;
        }
    };
    let mut text = saved.lines.join("\n");
    text.push('\n');
    match History::parse(&text) {
        Ok(mut history) => {
            // Histories of earlier releases name tenants by display name.
            let renamed = history.rename_tenants(TenantKey::text_from_legacy);
            if renamed > 0 {
                tracing::info!(
                    identities = renamed,
                    "job history identities named by a tenant's name are now kept by its key \
                     (the Unix user of that name when there is one, else the token tenant)"
                );
            }
            tracing::info!(
                identities = history.len(),
                file = %dir.file_of::<SavedHistory>().display(),
                "job history restored"
            );
            Some(history)
        }
        Err(err) => {
            let file = dir.file_of::<SavedHistory>();
            let kept = dir.keep_copy(&file).map_or_else(
                |e| format!("no copy kept: {e}"),
                |k| format!("kept as {}", k.display()),
            );
            tracing::error!(file = %file.display(), cause = %err, kept, "the job history could not be read; starting with none");
            None
        }
    }
}

/// Saves the history on a thread of its own; saves asked for while one is
/// being written are merged into the next.
#[derive(Clone)]
pub struct HistorySaver {
    tx: mpsc::Sender<SavedHistory>,
    file: PathBuf,
}

impl HistorySaver {
    pub fn start(dir: Arc<StateDir>) -> std::io::Result<HistorySaver> {
        let file = dir.file_of::<SavedHistory>();
        let (tx, rx) = mpsc::channel::<SavedHistory>();
        std::thread::Builder::new()
            .name("salus-history".into())
            .spawn(move || {
                while let Ok(mut latest) = rx.recv() {
                    while let Ok(newer) = rx.try_recv() {
                        latest = newer;
                    }
                    if let Err(err) = dir.save(&latest) {
                        tracing::error!(cause = %err, "cannot save the job history");
                    }
                }
            })?;
        Ok(HistorySaver { tx, file })
    }

    /// The file it saves to.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Saves `history` as it is now (its text is taken here, the write happens later).
    pub fn save(&self, history: &History) {
        let _ = self.tx.send(SavedHistory::of(history));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_hash_ignores_node_order_and_sees_every_name_and_op() {
        let nodes = [("x", "Placeholder"), ("w", "VarHandleOp"), ("y", "MatMul")];
        let mut forward = ShapeHash::default();
        nodes.iter().for_each(|(n, o)| forward.add_node(n, o));
        let mut backward = ShapeHash::default();
        nodes
            .iter()
            .rev()
            .for_each(|(n, o)| backward.add_node(n, o));
        assert_eq!(forward, backward);
        let mut split = ShapeHash::default();
        split.add_node("x", "Placeholder");
        let mut rest = ShapeHash::default();
        rest.add_node("w", "VarHandleOp");
        rest.add_node("y", "MatMul");
        split.merge(rest);
        assert_eq!(split, forward);
        let mut other_op = ShapeHash::default();
        other_op.add_node("x", "Placeholder");
        other_op.add_node("w", "VarHandleOp");
        other_op.add_node("y", "Conv2D");
        assert_ne!(other_op, forward);
        // Name and op are kept apart: "ab"+"c" is not "a"+"bc".
        let (mut a, mut b) = (ShapeHash::default(), ShapeHash::default());
        a.add_node("ab", "c");
        b.add_node("a", "bc");
        assert_ne!(a, b);
        assert_eq!(forward.fingerprint('g').len(), 17);
    }

    #[test]
    fn a_run_ends_failed_only_when_its_last_main_iteration_failed_otherwise_than_end_of_input() {
        let facts = HistoryFacts::default();
        assert!(facts.first_main());
        assert!(!facts.first_main());
        assert_eq!(facts.end_when_closed(), RunEnd::Completed);
        facts.main_ended(Some(TfCode::Internal));
        assert_eq!(facts.end_when_closed(), RunEnd::Failed);
        facts.main_ended(None);
        assert_eq!(facts.end_when_closed(), RunEnd::Completed);
        facts.main_ended(Some(TfCode::OutOfRange));
        assert_eq!(facts.end_when_closed(), RunEnd::Completed);
    }

    #[test]
    fn identities_gain_their_fingerprint_and_are_forgotten() {
        let mut ids = JobIdentities::default();
        ids.open(JobId(1), "alice", "train.py");
        assert_eq!(
            ids.get(JobId(1)),
            Some(&JobIdentity::new("alice", "train.py", None))
        );
        assert_eq!(
            ids.set_fingerprint(JobId(1), "g00ff"),
            Some(JobIdentity::new("alice", "train.py", Some("g00ff")))
        );
        assert_eq!(ids.set_fingerprint(JobId(2), "g00ff"), None);
        ids.forget(JobId(1));
        assert_eq!(ids.get(JobId(1)), None);
    }

    #[test]
    fn the_history_file_round_trips_and_a_bad_one_is_kept_aside() {
        let path = crate::state_dir::temp_dir("history");
        let state = StateDir::open(&path).unwrap();
        assert!(load_history(&state).is_none());
        let mut history = History::default();
        let who = JobIdentity::new("root", "a\tb.py", Some("g01"));
        history.record(
            &who,
            PastRun {
                device_s: 12.5,
                iterations: 100,
                end: RunEnd::Completed,
            },
        );
        state.save(&SavedHistory::of(&history)).unwrap();
        let back = load_history(&state).unwrap();
        // A history of an earlier release, by display name: read by key.
        let keyed = JobIdentity::new("uid:0", "a\tb.py", Some("g01"));
        assert_eq!(back.runs(&keyed), history.runs(&who));
        assert!(back.runs(&who).is_empty());
        let mut history = History::default();
        history.record(
            &keyed,
            PastRun {
                device_s: 12.5,
                iterations: 100,
                end: RunEnd::Completed,
            },
        );
        history.record(
            &JobIdentity::new("name:root", "x", None),
            PastRun {
                device_s: 1.0,
                iterations: 1,
                end: RunEnd::Completed,
            },
        );
        state.save(&SavedHistory::of(&history)).unwrap();
        let back = load_history(&state).unwrap();
        assert_eq!(back.runs(&keyed).len(), 1);
        assert_eq!(
            back.runs(&JobIdentity::new("name:root", "x", None)).len(),
            1
        );
        // A file of the right envelope whose text is not a history.
        state
            .save(&SavedHistory {
                lines: vec!["salus-history\t1".into(), "run\tonly-two".into()],
            })
            .unwrap();
        assert!(load_history(&state).is_none());
        let kept = std::fs::read_dir(&path)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("history.json.bad-")
            })
            .count();
        assert_eq!(kept, 1);
        let _ = std::fs::remove_dir_all(&path);
    }
}
