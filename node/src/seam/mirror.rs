//! What the supervisor knows of this executor, kept by the executor from the
//! messages that cross the seam, so that a new supervisor can adopt it after
//! the old one is gone: the executor replays it as ordinary seam messages
//! (the new supervisor checks them as it checks any other).
//!
//! Kept per job: its opening, its lane and hints, its fingerprint and its
//! memory admission; and the requests still waiting for an answer: openings,
//! admissions, wanted iterations, and iterations running on a go-ahead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::seam::msg::{self, to_executor, to_supervisor};

#[derive(Default)]
pub struct Mirror {
    jobs: BTreeMap<u64, JobMirror>,
    /// OpenJob by request id, until Opened.
    opening: BTreeMap<u64, msg::OpenJob>,
    /// Admit by request id, until Admitted.
    admitting: BTreeMap<u64, msg::Admit>,
    /// Want by turn, with its deadline, until Go or Dropped.
    wanted: BTreeMap<u64, (msg::Want, Option<Instant>)>,
    /// Turns that got Go and have not sent Done: turn -> job.
    running: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct JobMirror {
    opened: Option<msg::OpenJob>,
    added: Option<msg::AddJob>,
    fingerprint: Option<String>,
    /// The Admit the supervisor granted (the job holds its memory).
    admitted: Option<msg::Admit>,
}

impl Mirror {
    /// A message on its way to the supervisor.
    pub fn sent(&mut self, message: &to_supervisor::Msg) {
        use to_supervisor::Msg;
        match message {
            Msg::OpenJob(open) if open.id != 0 => {
                self.opening.insert(open.id, open.clone());
            }
            Msg::AddJob(add) => self.jobs.entry(add.job).or_default().added = Some(add.clone()),
            Msg::RemoveJob(remove) => {
                self.jobs.remove(&remove.job);
                self.admitting.retain(|_, a| a.job != remove.job);
            }
            Msg::SetFingerprint(set) => {
                self.jobs.entry(set.job).or_default().fingerprint = Some(set.fingerprint.clone())
            }
            Msg::Admit(admit) if !admit.held => {
                self.admitting.insert(admit.id, admit.clone());
            }
            Msg::Release(release) => {
                if let Some(job) = self.jobs.get_mut(&release.job) {
                    job.admitted = None;
                }
            }
            Msg::Withdraw(withdraw) => self.admitting.retain(|_, a| a.job != withdraw.job),
            Msg::Want(want) if !want.running => {
                let deadline = (want.deadline_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(want.deadline_ms));
                self.wanted.insert(want.turn, (want.clone(), deadline));
            }
            Msg::Cancel(cancel) => {
                self.wanted.remove(&cancel.turn);
            }
            Msg::Done(done) => {
                self.running.remove(&done.turn);
            }
            _ => {}
        }
    }

    /// A message from the supervisor.
    pub fn received(&mut self, message: &to_executor::Msg) {
        use to_executor::Msg;
        match message {
            Msg::Opened(opened) => {
                if let Some(open) = self.opening.remove(&opened.id) {
                    if opened.error.is_none() {
                        let job = open.job;
                        self.jobs.entry(job).or_default().opened = Some(open);
                    }
                }
            }
            Msg::Admitted(admitted) => {
                if let Some(admit) = self.admitting.remove(&admitted.id) {
                    if let Some(msg::admitted::Outcome::Lane(_)) = admitted.outcome {
                        let job = admit.job;
                        self.jobs.entry(job).or_default().admitted = Some(admit);
                    }
                }
            }
            Msg::Go(go) => {
                if let Some((want, _)) = self.wanted.remove(&go.turn) {
                    self.running.insert(go.turn, want.job);
                }
            }
            Msg::Dropped(dropped) => {
                self.wanted.remove(&dropped.turn);
            }
            _ => {}
        }
    }

    /// What a new supervisor must be told, in order: each job as it stands
    /// (opened, its memory, its lane and hints, its fingerprint), the
    /// iterations running now, then every request still waiting.
    pub fn replay(&self) -> Vec<to_supervisor::Msg> {
        use to_supervisor::Msg;
        let mut out = Vec::new();
        for (&job, state) in &self.jobs {
            if let Some(open) = &state.opened {
                out.push(Msg::OpenJob(msg::OpenJob {
                    id: 0,
                    ..open.clone()
                }));
            }
            if let Some(admit) = &state.admitted {
                out.push(Msg::Admit(msg::Admit {
                    id: 0,
                    held: true,
                    ..admit.clone()
                }));
            }
            if let Some(add) = &state.added {
                out.push(Msg::AddJob(add.clone()));
            }
            if let Some(fingerprint) = &state.fingerprint {
                out.push(Msg::SetFingerprint(msg::SetFingerprint {
                    job,
                    fingerprint: fingerprint.clone(),
                }));
            }
        }
        for (&turn, &job) in &self.running {
            out.push(Msg::Want(msg::Want {
                turn,
                job,
                deadline_ms: 0,
                running: true,
            }));
        }
        out.extend(self.admitting.values().cloned().map(Msg::Admit));
        out.extend(self.opening.values().cloned().map(Msg::OpenJob));
        let now = Instant::now();
        for (want, deadline) in self.wanted.values() {
            let deadline_ms = deadline.map_or(0, |d| {
                (d.saturating_duration_since(now).as_millis() as u64).max(1)
            });
            out.push(Msg::Want(msg::Want {
                deadline_ms,
                ..want.clone()
            }));
        }
        out
    }

    /// Requests still waiting for the supervisor: (openings, admissions, wanted turns).
    pub fn waiting(&self) -> (usize, usize, usize) {
        (self.opening.len(), self.admitting.len(), self.wanted.len())
    }

    /// Jobs the supervisor knows.
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use to_supervisor::Msg;

    fn names(replay: &[Msg]) -> Vec<String> {
        replay
            .iter()
            .map(|m| match m {
                Msg::OpenJob(o) => format!("open {} id {}", o.job, o.id),
                Msg::AddJob(a) => format!("add {} lane {}", a.job, a.lane),
                Msg::SetFingerprint(f) => format!("fingerprint {} {}", f.job, f.fingerprint),
                Msg::Admit(a) => format!("admit {} id {} held {}", a.job, a.id, a.held),
                Msg::Want(w) => format!("want {} turn {} running {}", w.job, w.turn, w.running),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_replay_holds_what_the_supervisor_knew_and_what_waits() {
        let mut mirror = Mirror::default();
        // Job 1: opened, admitted, added, fingerprinted, one iteration running.
        mirror.sent(&Msg::OpenJob(msg::OpenJob {
            job: 1,
            id: 10,
            name: "a".into(),
            eager: false,
        }));
        mirror.received(&to_executor::Msg::Opened(msg::Opened {
            id: 10,
            error: None,
        }));
        mirror.sent(&Msg::Admit(msg::Admit {
            id: 11,
            job: 1,
            persistent: 5,
            ..Default::default()
        }));
        mirror.received(&to_executor::Msg::Admitted(msg::Admitted {
            id: 11,
            outcome: Some(msg::admitted::Outcome::Lane(3)),
        }));
        mirror.sent(&Msg::AddJob(msg::AddJob {
            job: 1,
            lane: 3,
            hints: None,
        }));
        mirror.sent(&Msg::SetFingerprint(msg::SetFingerprint {
            job: 1,
            fingerprint: "f".into(),
        }));
        mirror.sent(&Msg::Want(msg::Want {
            turn: 12,
            job: 1,
            ..Default::default()
        }));
        mirror.received(&to_executor::Msg::Go(msg::Go {
            turn: 12,
            sent_mono_ns: 0,
        }));
        // Job 2: refused at opening; job 3: opening and admission unanswered, an iteration wanted.
        mirror.sent(&Msg::OpenJob(msg::OpenJob {
            job: 2,
            id: 20,
            name: "b".into(),
            eager: true,
        }));
        mirror.received(&to_executor::Msg::Opened(msg::Opened {
            id: 20,
            error: Some(msg::AdmitError {
                code: 8,
                message: "max jobs".into(),
            }),
        }));
        mirror.sent(&Msg::OpenJob(msg::OpenJob {
            job: 3,
            id: 30,
            name: "c".into(),
            eager: false,
        }));
        mirror.sent(&Msg::Admit(msg::Admit {
            id: 31,
            job: 3,
            ..Default::default()
        }));
        mirror.sent(&Msg::Want(msg::Want {
            turn: 32,
            job: 3,
            deadline_ms: 60_000,
            running: false,
        }));
        // A wanted turn given up, and one dropped by the supervisor, leave no trace.
        mirror.sent(&Msg::Want(msg::Want {
            turn: 40,
            job: 1,
            ..Default::default()
        }));
        mirror.sent(&Msg::Cancel(msg::Cancel { turn: 40 }));
        mirror.sent(&Msg::Want(msg::Want {
            turn: 41,
            job: 1,
            ..Default::default()
        }));
        mirror.received(&to_executor::Msg::Dropped(msg::Dropped {
            turn: 41,
            reason: String::new(),
        }));

        let replay = mirror.replay();
        assert_eq!(
            names(&replay),
            [
                "open 1 id 0",
                "admit 1 id 0 held true",
                "add 1 lane 3",
                "fingerprint 1 f",
                "want 1 turn 12 running true",
                "admit 3 id 31 held false",
                "open 3 id 30",
                "want 3 turn 32 running false",
            ]
        );
        let Msg::Want(wanted) = &replay[7] else {
            unreachable!()
        };
        assert!(
            wanted.deadline_ms > 0 && wanted.deadline_ms <= 60_000,
            "{}",
            wanted.deadline_ms
        );
        assert_eq!(mirror.waiting(), (1, 1, 1));

        // The running iteration ends, the memory is released, job 1 leaves: nothing of it is replayed.
        mirror.sent(&Msg::Done(msg::Done {
            turn: 12,
            go_delay_ns: 0,
        }));
        mirror.sent(&Msg::Release(msg::Release { job: 1 }));
        assert!(names(&mirror.replay())
            .iter()
            .all(|n| !n.contains("held true") && !n.contains("running true")));
        mirror.sent(&Msg::RemoveJob(msg::RemoveJob {
            job: 1,
            end: "completed".into(),
        }));
        mirror.sent(&Msg::RemoveJob(msg::RemoveJob {
            job: 3,
            end: "cancelled".into(),
        }));
        assert_eq!(
            names(&mirror.replay()),
            ["open 3 id 30", "want 3 turn 32 running false"]
        );
        assert_eq!(mirror.jobs(), 0);
    }
}
