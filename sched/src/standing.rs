//! Where a waiting job stands on its lane: the facts behind the admin API's
//! "waiting because…" note, the same under every policy (the policy's key
//! orders the lane; tenants share it first when `--share tenants`).

use std::collections::BTreeSet;

use crate::policy::{Expected, Hold};
use crate::{JobId, JobStatus, LaneId, Scheduler};

/// How many of the jobs ranked ahead a standing names.
const AHEAD_NAMED: usize = 3;

/// Where a job with iterations queued and none running stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    pub lane: LaneId,
    /// Its place (1 = first) among the lane's jobs that have work queued or
    /// running (or hold the lane, under fifo), in the policy's order.
    pub rank: usize,
    /// How many jobs of the lane have work queued or running, itself included.
    pub contenders: usize,
    /// The first few of the jobs ranked ahead of it, best first.
    pub ahead: Vec<JobId>,
    /// The jobs running an iteration on the lane now.
    pub running: Vec<JobId>,
    /// Other tenants of the lane, with work, that have used less device time
    /// than its tenant: their turns come first.
    pub tenants_first: usize,
    /// The lane runs as many iterations at once as it may.
    pub lane_full: bool,
    /// The policy's ranking rule, in words ([`crate::policy::Policy::rule`]).
    pub rule: &'static str,
    /// What the policy expects of its remaining work, if it ranks by length.
    pub expected: Option<Expected>,
    /// Of the jobs ranked ahead, how many the policy expects to need less
    /// than it (with `expected`).
    pub ahead_shorter: usize,
}

impl<W> Scheduler<W> {
    /// A job's status and, if it waits, where it stands, as of one moment:
    /// what a row of the admin API shows. The standing walks the job's lane,
    /// so [`Scheduler::status`], which the runtime reads on its own paths,
    /// leaves it out.
    pub fn status_with_standing(&self, id: JobId) -> Option<(JobStatus, Option<Standing>)> {
        Some((self.status(id)?, self.standing(id)))
    }

    /// Where `id` stands, if it waits: iterations queued and none running.
    pub fn standing(&self, id: JobId) -> Option<Standing> {
        let job = self.jobs.get(&id)?;
        if job.queue.is_empty() || job.running > 0 {
            return None;
        }
        let lane = self.lanes.get(&job.lane)?;
        // Under a policy that holds the lane for the best job as long as it
        // lives (fifo), a job between iterations stands ahead too.
        let holds_while_alive = self.policy.hold() == Hold::Always;
        let busy = |other: &JobId| {
            self.jobs.get(other).is_some_and(|j| {
                !j.queue.is_empty() || j.running > 0 || (holds_while_alive && j.iterations > 0)
            })
        };
        let contenders: Vec<JobId> = lane
            .all
            .iter()
            .map(|&(_, other)| other)
            .filter(busy)
            .collect();
        let before = contenders
            .iter()
            .position(|&other| other == id)
            .unwrap_or(contenders.len());
        let running = lane
            .all
            .iter()
            .map(|&(_, other)| other)
            .filter(|other| self.jobs.get(other).is_some_and(|j| j.running > 0))
            .collect();
        let tenants_first = if self.shares_between_tenants(lane) {
            let own = self.tenants.vtime(job.tenant);
            contenders
                .iter()
                .filter_map(|other| self.jobs.get(other).map(|j| j.tenant))
                .filter(|&tenant| tenant != job.tenant && self.tenants.vtime(tenant) < own)
                .collect::<BTreeSet<_>>()
                .len()
        } else {
            0
        };
        let expected_of = |other: JobId| {
            self.jobs
                .get(&other)
                .and_then(|j| self.policy.expected(&self.view_of(other, j)))
        };
        let expected = expected_of(id);
        let ahead_shorter = expected.map_or(0, |mine| {
            contenders[..before]
                .iter()
                .filter_map(|&other| expected_of(other))
                .filter(|theirs| theirs.remaining_ns < mine.remaining_ns)
                .count()
        });
        Some(Standing {
            lane: job.lane,
            rank: before + 1,
            contenders: contenders.len().max(before + 1),
            ahead: contenders[..before]
                .iter()
                .take(AHEAD_NAMED)
                .copied()
                .collect(),
            running,
            tenants_first,
            lane_full: lane.running >= self.config.lane_concurrency,
            rule: self.policy.rule(),
            expected,
            ahead_shorter,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::by_name;
    use crate::tenants::TenantId;
    use crate::*;

    const MS: Nanos = 1_000_000;
    const L: LaneId = LaneId(0);

    fn sched(policy: &str, share: Share) -> Scheduler<&'static str> {
        Scheduler::new(
            by_name(policy).unwrap(),
            SchedConfig {
                lane_concurrency: 1,
                anticipation: 2 * MS,
                share,
            },
        )
    }

    /// Starts `job`'s queued iteration (it must be the one the lane picks).
    fn start(s: &mut Scheduler<&'static str>, job: JobId, now: Nanos) {
        match s.next(L, now) {
            Decision::Run(d) => assert_eq!(d.job, job),
            other => panic!("expected {job:?} to run, got {other:?}"),
        }
    }

    #[test]
    fn a_running_or_idle_job_has_no_standing() {
        let mut s = sched("fair", Share::Jobs);
        s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
        assert_eq!(s.standing(JobId(1)), None, "idle");
        s.submit(JobId(1), "a", 1).unwrap();
        start(&mut s, JobId(1), 2);
        assert_eq!(s.standing(JobId(1)), None, "running");
        assert_eq!(s.standing(JobId(9)), None, "unknown");
    }

    #[test]
    fn a_queued_job_names_who_runs_and_who_ranks_ahead() {
        let mut s = sched("fair", Share::Jobs);
        for id in 1..=3 {
            s.add_job(JobId(id), L, Hints::default(), id).unwrap();
        }
        // Job 1 has used device time: under fair it ranks last of the three.
        s.submit(JobId(1), "a", 4).unwrap();
        start(&mut s, JobId(1), 5);
        s.finish(JobId(1), L, Some(50 * MS), 55 * MS);
        s.submit(JobId(1), "a", 56 * MS).unwrap();
        s.submit(JobId(2), "b", 56 * MS).unwrap();
        start(&mut s, JobId(2), 57 * MS);
        s.submit(JobId(3), "c", 58 * MS).unwrap();

        let third = s.standing(JobId(3)).expect("job 3 waits");
        assert_eq!((third.rank, third.contenders), (2, 3));
        assert_eq!(third.ahead, vec![JobId(2)]);
        assert_eq!(third.running, vec![JobId(2)]);
        assert!(third.lane_full);
        assert_eq!(third.tenants_first, 0);
        assert_eq!(third.rule, by_name("fair").unwrap().rule());

        let first = s.standing(JobId(1)).expect("job 1 waits");
        assert_eq!((first.rank, first.contenders), (3, 3));
        assert_eq!(first.ahead, vec![JobId(2), JobId(3)]);
        assert_eq!(s.status_with_standing(JobId(1)).unwrap().1, Some(first));
    }

    #[test]
    fn under_learned_it_says_what_it_expects_and_who_ahead_is_shorter() {
        use crate::policy::Basis;
        let mut s = sched("learned", Share::Jobs);
        let seconds = |s: f64| Hints {
            expected_seconds: Some(s),
            ..Default::default()
        };
        // Job 1 runs; jobs 2 (10 s) and 3 (100 s) are told their lengths;
        // job 4 is told nothing, and no job has finished: no law yet.
        s.add_job(JobId(1), L, seconds(1.0), 1).unwrap();
        s.add_job(JobId(2), L, seconds(10.0), 2).unwrap();
        s.add_job(JobId(3), L, seconds(100.0), 3).unwrap();
        s.add_job(JobId(4), L, Hints::default(), 4).unwrap();
        s.submit(JobId(1), "a", 5).unwrap();
        start(&mut s, JobId(1), 6);
        for id in 2..=4 {
            s.submit(JobId(id), "w", 7).unwrap();
        }
        let third = s.standing(JobId(3)).expect("job 3 waits");
        let expected = third.expected.expect("learned ranks by length");
        assert_eq!(expected.basis, Basis::Hints);
        assert!((expected.remaining_ns - 100e9).abs() < 1.0);
        assert_eq!((third.rank, third.ahead_shorter), (3, 2));
        let fourth = s.standing(JobId(4)).expect("job 4 waits");
        assert_eq!(fourth.expected, None);
        // Under a policy that ranks without lengths: nothing expected.
        let mut fair = sched("fair", Share::Jobs);
        fair.add_job(JobId(1), L, seconds(1.0), 1).unwrap();
        fair.add_job(JobId(2), L, seconds(1.0), 2).unwrap();
        fair.submit(JobId(1), "a", 3).unwrap();
        start(&mut fair, JobId(1), 4);
        fair.submit(JobId(2), "b", 5).unwrap();
        let waiting = fair.standing(JobId(2)).unwrap();
        assert_eq!((waiting.expected, waiting.ahead_shorter), (None, 0));
    }

    #[test]
    fn under_fifo_a_live_earlier_job_between_iterations_stands_ahead() {
        let mut s = sched("fifo", Share::Jobs);
        s.add_job(JobId(1), L, Hints::default(), 0).unwrap();
        s.add_job(JobId(2), L, Hints::default(), 1).unwrap();
        s.submit(JobId(1), "a", 2).unwrap();
        start(&mut s, JobId(1), 3);
        s.finish(JobId(1), L, Some(MS), 4 * MS);
        s.submit(JobId(2), "b", 5 * MS).unwrap();
        let second = s.standing(JobId(2)).expect("job 2 waits");
        assert_eq!(second.ahead, vec![JobId(1)]);
        assert_eq!((second.rank, second.contenders), (2, 2));
        assert!(second.running.is_empty() && !second.lane_full);
    }

    #[test]
    fn tenants_with_less_device_time_go_first() {
        let mut s = sched("fair", Share::Tenants);
        s.add_tenant_job(JobId(1), L, TenantId(1), Hints::default(), 0)
            .unwrap();
        s.add_tenant_job(JobId(2), L, TenantId(2), Hints::default(), 0)
            .unwrap();
        s.submit(JobId(1), "a", 1).unwrap();
        start(&mut s, JobId(1), 2);
        s.finish(JobId(1), L, Some(40 * MS), 42 * MS);
        s.submit(JobId(1), "a", 43 * MS).unwrap();
        s.submit(JobId(2), "b", 43 * MS).unwrap();
        let busy_tenant = s.standing(JobId(1)).expect("job 1 waits");
        assert_eq!(busy_tenant.tenants_first, 1);
        assert_eq!(s.standing(JobId(2)).expect("job 2 waits").tenants_first, 0);
    }
}
