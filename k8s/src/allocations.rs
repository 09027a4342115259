//! What the plugin handed out: one token (and reservation) per container
//! allocation, and when to take it back. The kubelet never says when a pod
//! ends, so an allocation is released when
//! - the kubelet allocates one of its devices again (it frees a pod's devices
//!   only when the pod is gone),
//! - its jobs have all ended for `release_after` (the pod's training is over;
//!   a job that opened and closed between two polls counts too: the server
//!   counts the jobs each tenant with a reservation started),
//! - no job of it ever showed up within `unused_timeout` (the pod never ran,
//!   or never reached the server).
//!
//! Plain state, no I/O and no clock of its own: the caller passes `now`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A tenant's jobs on the server, as one poll saw them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantJobs {
    /// Open now.
    pub open: u64,
    /// Started since the server started, closed ones included.
    pub started: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The token's public id (what `ctl token revoke` takes).
    pub token_id: String,
    /// The token's tenant, unique to this allocation: what its jobs show as.
    pub tenant: String,
    /// The device IDs the kubelet allocated (empty for a token adopted after a
    /// restart of the plugin: the kubelet's IDs for it are not known).
    pub devices: Vec<String>,
    pub issued: Instant,
    /// When a job of its tenant was last seen on the server.
    pub last_job: Option<Instant>,
    /// Its tenant's `TenantJobs::started` at the last sweep: a higher count
    /// means a job came since, though none may be open now.
    pub jobs_started: u64,
}

/// Why an allocation is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    DevicesReallocated,
    JobsEnded,
    NeverConnected,
}

impl Release {
    pub fn describe(self) -> &'static str {
        match self {
            Release::DevicesReallocated => {
                "the kubelet allocated its devices again (its pod is gone)"
            }
            Release::JobsEnded => "its jobs ended",
            Release::NeverConnected => "no job of it reached the server in time",
        }
    }
}

#[derive(Debug)]
pub struct Allocations {
    live: Vec<Allocation>,
    unused_timeout: Duration,
    release_after: Duration,
}

impl Allocations {
    pub fn new(unused_timeout: Duration, release_after: Duration) -> Allocations {
        Allocations {
            live: Vec::new(),
            unused_timeout,
            release_after,
        }
    }

    pub fn add(&mut self, allocation: Allocation) {
        self.live.push(allocation);
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// The device IDs the allocations hold.
    pub fn devices_held(&self) -> HashSet<String> {
        self.live
            .iter()
            .flat_map(|a| a.devices.iter().cloned())
            .collect()
    }

    pub fn knows_token(&self, token_id: &str) -> bool {
        self.live.iter().any(|a| a.token_id == token_id)
    }

    /// Removes and returns the allocations holding any of `devices`.
    pub fn take_overlapping(&mut self, devices: &[String]) -> Vec<Allocation> {
        let (taken, kept) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|a: &Allocation| a.devices.iter().any(|d| devices.contains(d)));
        self.live = kept;
        taken
    }

    /// Notes which tenants have had jobs since the last sweep (`jobs`, by
    /// tenant: a tenant not there has none); removes and returns the
    /// allocations to release `now`.
    pub fn sweep(
        &mut self,
        jobs: &HashMap<String, TenantJobs>,
        now: Instant,
    ) -> Vec<(Allocation, Release)> {
        let mut released = Vec::new();
        let mut kept = Vec::new();
        for mut a in std::mem::take(&mut self.live) {
            let seen = jobs.get(&a.tenant).copied().unwrap_or_default();
            // A count below the last one: the server restarted and counts anew.
            let came_and_went = seen.started > a.jobs_started;
            a.jobs_started = seen.started;
            if seen.open > 0 || came_and_went {
                a.last_job = Some(now);
            }
            let why = match a.last_job {
                Some(seen) if now.duration_since(seen) >= self.release_after => {
                    Some(Release::JobsEnded)
                }
                None if now.duration_since(a.issued) >= self.unused_timeout => {
                    Some(Release::NeverConnected)
                }
                _ => None,
            };
            match why {
                Some(why) => released.push((a, why)),
                None => kept.push(a),
            }
        }
        self.live = kept;
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(tenant: &str, devices: &[&str], issued: Instant) -> Allocation {
        Allocation {
            token_id: format!("id-{tenant}"),
            tenant: tenant.into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            issued,
            last_job: None,
            jobs_started: 0,
        }
    }

    fn jobs(of: &[(&str, u64, u64)]) -> HashMap<String, TenantJobs> {
        of.iter()
            .map(|&(tenant, open, started)| (tenant.to_string(), TenantJobs { open, started }))
            .collect()
    }

    #[test]
    fn devices_allocated_again_release_their_old_allocation() {
        let t0 = Instant::now();
        let mut all = Allocations::new(Duration::from_secs(60), Duration::from_secs(30));
        all.add(allocation("a", &["m-0", "m-1"], t0));
        all.add(allocation("b", &["m-2"], t0));
        let taken = all.take_overlapping(&["m-1".into(), "m-5".into()]);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].tenant, "a");
        assert_eq!(all.len(), 1);
        assert!(all.take_overlapping(&["m-9".into()]).is_empty());
    }

    #[test]
    fn an_allocation_is_kept_while_its_jobs_run_and_released_after_they_end() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut all = Allocations::new(s(60), s(30));
        all.add(allocation("a", &["m-0"], t0));
        assert!(all.sweep(&jobs(&[("a", 1, 1)]), t0 + s(10)).is_empty());
        // Its jobs ended at +10: kept until +40, released then.
        let ended = jobs(&[("a", 0, 1)]);
        assert!(all.sweep(&ended, t0 + s(39)).is_empty());
        let released = all.sweep(&ended, t0 + s(40));
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].1, Release::JobsEnded);
    }

    #[test]
    fn an_allocation_whose_job_never_came_is_released_after_the_timeout() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut all = Allocations::new(s(60), s(30));
        all.add(allocation("a", &["m-0"], t0));
        assert!(all.sweep(&HashMap::new(), t0 + s(59)).is_empty());
        let released = all.sweep(&HashMap::new(), t0 + s(60));
        assert_eq!(released[0].1, Release::NeverConnected);
        assert_eq!(all.len(), 0);
    }

    #[test]
    fn a_job_that_came_and_went_between_two_sweeps_counts_as_just_ended() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut all = Allocations::new(s(60), s(30));
        all.add(allocation("a", &["m-0"], t0));
        assert!(all.sweep(&jobs(&[("b", 1, 1)]), t0 + s(5)).is_empty());
        // Between +5 and +10 a job of "a" opened and closed: none open at +10.
        let after = jobs(&[("a", 0, 1)]);
        assert!(all.sweep(&after, t0 + s(10)).is_empty());
        // Released 30 s after the sweep that saw it, not after the 60 s timeout.
        assert!(all.sweep(&after, t0 + s(39)).is_empty());
        let released = all.sweep(&after, t0 + s(40));
        assert_eq!(released[0].1, Release::JobsEnded);
    }

    #[test]
    fn a_second_short_job_keeps_the_allocation_and_a_server_restart_is_no_job() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut all = Allocations::new(s(60), s(30));
        all.add(allocation("a", &["m-0"], t0));
        all.sweep(&jobs(&[("a", 0, 1)]), t0 + s(10));
        // Another job came and went before +35: kept past +40.
        all.sweep(&jobs(&[("a", 0, 2)]), t0 + s(35));
        assert!(all.sweep(&jobs(&[("a", 0, 2)]), t0 + s(64)).is_empty());
        // The server restarted (its counts start over): no new job, so released
        // 30 s after the last one seen.
        let released = all.sweep(&jobs(&[("a", 0, 0)]), t0 + s(65));
        assert_eq!(released[0].1, Release::JobsEnded);
    }
}
