//! The scheduler core numbers tenants ([`TenantId`]); this maps the server's
//! tenants to those numbers, remembers which tenant owns each job (so a job
//! joins the core as its tenant's whichever path admits it), and holds the
//! tenants' limits: how many jobs each may open, the highest priority it may
//! claim, its weight.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::sched::{Hints, JobId, TenantId};
use crate::tenant::identity::{Tenant, TenantKey};
use crate::tenant::limits::{Limits, LimitsTable};

#[derive(Default)]
pub struct TenantIds {
    ids: HashMap<TenantKey, TenantId>,
    /// Indexed by id - 1: the tenant as first seen (its name for figures).
    tenants: Vec<Tenant>,
    owners: HashMap<JobId, TenantId>,
    limits: LimitsTable,
    /// Jobs whose priority hint was lowered to their tenant's limit: the one asked.
    clamped: HashMap<JobId, i32>,
    /// Jobs and memory requests refused per tenant (max-jobs, memory share,
    /// too large for the device, admission timed out).
    refusals: HashMap<TenantId, u64>,
    /// Jobs opened per tenant since start, closed ones included: what tells
    /// a watcher polling now and then that a short job came and went.
    opened: HashMap<TenantId, u64>,
}

/// A priority hint lowered to the tenant's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clamp {
    pub asked: i32,
    pub max: i32,
}

impl TenantIds {
    /// The id of `tenant`, numbered from 1 on first sight.
    pub fn id_of(&mut self, tenant: &Tenant) -> TenantId {
        if let Some(&id) = self.ids.get(&tenant.key) {
            return id;
        }
        let id = TenantId(self.tenants.len() as u64 + 1);
        self.ids.insert(tenant.key.clone(), id);
        self.tenants.push(tenant.clone());
        id
    }

    /// The id of an already seen tenant.
    pub fn find(&self, key: &TenantKey) -> Option<TenantId> {
        self.ids.get(key).copied()
    }

    /// The owner of `job`, or [`TenantId::NONE`] for a job opened without one.
    pub fn owner(&self, job: JobId) -> TenantId {
        self.owners.get(&job).copied().unwrap_or(TenantId::NONE)
    }

    pub fn forget_job(&mut self, job: JobId) {
        self.owners.remove(&job);
        self.clamped.remove(&job);
    }

    pub fn set_limits_table(&mut self, limits: LimitsTable) {
        self.limits = limits;
    }

    /// The tenants file's limits replaced by `limits`', tokens' grants kept.
    pub fn replace_file_limits(&mut self, limits: LimitsTable) {
        self.limits = limits.with_grants_of(&self.limits);
    }

    /// Changes `name`'s limits (`*`: the defaults); the set fields replace.
    pub fn set_limits(&mut self, name: &str, limits: &Limits) {
        self.limits.set(name, limits);
    }

    pub fn set_granted(&mut self, name: &str, granted: Option<Limits>) {
        self.limits.set_granted(name, granted);
    }

    /// The limits that apply to the tenant named `name` (`*`: the defaults).
    pub fn limits_named(&self, name: &str) -> Limits {
        self.limits.named(name)
    }

    /// The limits that apply to tenant `id` now (none for an unknown one).
    pub fn limits_of(&self, id: TenantId) -> Limits {
        self.tenant(id).map_or_else(Limits::default, |t| {
            self.limits.for_tenant(&t.name, t.user.as_deref())
        })
    }

    /// Every tenant seen, with its id.
    pub fn known(&self) -> impl Iterator<Item = (TenantId, &Tenant)> {
        self.tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantId(i as u64 + 1), t))
    }

    /// `job` opens for `tenant`, unless the tenant has its maximum of jobs open.
    pub fn open(&mut self, job: JobId, tenant: &Tenant) -> Result<TenantId> {
        let id = self.id_of(tenant);
        if let Some(max) = self
            .limits
            .for_tenant(&tenant.name, tenant.user.as_deref())
            .max_jobs
        {
            let open = self.owners.values().filter(|&&owner| owner == id).count();
            if open >= max as usize {
                *self.refusals.entry(id).or_default() += 1;
                return Err(Error::ResourceExhausted(format!(
                    "tenant {tenant} already has {open} open jobs (sessions and eager contexts), its \
                     limit (max-jobs={max}, set in the tenants file or by `salus limits`): \
                     close one first"
                )));
            }
        }
        self.owners.insert(job, id);
        *self.opened.entry(id).or_default() += 1;
        Ok(id)
    }

    /// Jobs `id` has opened since start, closed ones included.
    pub fn jobs_opened(&self, id: TenantId) -> u64 {
        self.opened.get(&id).copied().unwrap_or(0)
    }

    /// One more refusal for `job`'s owner.
    pub fn refused(&mut self, job: JobId) {
        *self.refusals.entry(self.owner(job)).or_default() += 1;
    }

    pub fn refusals_of(&self, id: TenantId) -> u64 {
        self.refusals.get(&id).copied().unwrap_or(0)
    }

    /// `hints` with the priority lowered to the owner's `max-priority`, as
    /// [`Self::clamp`] without remembering it (for a rank that is only read).
    pub fn capped(&self, job: JobId, mut hints: Hints) -> Hints {
        if let Some(max) = self.limits_of(self.owner(job)).max_priority {
            hints.priority = hints.priority.min(max);
        }
        hints
    }

    /// `hints` with the priority lowered to the owner's `max-priority`, the
    /// lowering remembered for the job's row.
    pub fn clamp(&mut self, job: JobId, mut hints: Hints) -> Hints {
        let max = self.limits_of(self.owner(job)).max_priority;
        match max {
            Some(max) if hints.priority > max => {
                self.clamped.insert(job, hints.priority);
                hints.priority = max;
            }
            _ => {
                self.clamped.remove(&job);
            }
        }
        hints
    }

    /// Whether `job`'s priority hint was lowered, from what to what.
    pub fn clamp_of(&self, job: JobId) -> Option<Clamp> {
        let asked = *self.clamped.get(&job)?;
        let max = self.limits_of(self.owner(job)).max_priority?;
        Some(Clamp { asked, max })
    }

    pub fn tenant(&self, id: TenantId) -> Option<&Tenant> {
        (id.0 as usize)
            .checked_sub(1)
            .and_then(|i| self.tenants.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::users::LOOKUPS;

    #[test]
    fn limits_under_the_schedulers_lock_look_no_user_up() {
        // A uid tenant matched by its user's name: the name was looked up when the tenant was built.
        let tenant = Tenant::from_uid(0);
        let mut ids = TenantIds::default();
        ids.set_limits(
            tenant.user.as_deref().unwrap(),
            &Limits::parse(["max-jobs=2", "max-priority=1", "weight=3"]).unwrap(),
        );
        let before = LOOKUPS.with(|n| n.get());
        // Job open, hints, weights and the admin rows: every path that reads limits.
        let id = ids.open(JobId(1), &tenant).unwrap();
        let hints = ids.clamp(
            JobId(1),
            Hints {
                priority: 5,
                ..Hints::default()
            },
        );
        assert_eq!(hints.priority, 1);
        assert_eq!(ids.limits_of(id).weight, Some(3));
        assert!(ids.clamp_of(JobId(1)).is_some());
        ids.open(JobId(2), &tenant).unwrap();
        assert!(ids.open(JobId(3), &tenant).is_err(), "max-jobs=2 applies");
        assert_eq!(LOOKUPS.with(|n| n.get()), before, "no user-database lookup");
    }

    #[test]
    fn tenants_are_numbered_once_and_jobs_keep_their_owner() {
        let mut ids = TenantIds::default();
        let a = Tenant::from_uid(0);
        let b = Tenant::anonymous();
        assert_eq!(ids.id_of(&a), TenantId(1));
        assert_eq!(ids.id_of(&b), TenantId(2));
        assert_eq!(ids.id_of(&a), TenantId(1));
        ids.open(JobId(7), &b).unwrap();
        assert_eq!(ids.owner(JobId(7)), TenantId(2));
        assert_eq!(ids.owner(JobId(8)), TenantId::NONE);
        assert_eq!(ids.tenant(TenantId(2)), Some(&b));
        assert_eq!(ids.tenant(TenantId::NONE), None);
        assert_eq!(ids.find(&TenantKey::Anonymous), Some(TenantId(2)));
        ids.forget_job(JobId(7));
        assert_eq!(ids.owner(JobId(7)), TenantId::NONE);
    }

    #[test]
    fn max_jobs_refuses_the_next_open_and_priorities_are_clamped() {
        let mut ids = TenantIds::default();
        let mut table = LimitsTable::default();
        table.set(
            "*",
            &Limits::parse(["max-jobs=2", "max-priority=3"]).unwrap(),
        );
        ids.set_limits_table(table);
        let a = Tenant::anonymous();
        ids.open(JobId(1), &a).unwrap();
        ids.open(JobId(2), &a).unwrap();
        let err = ids.open(JobId(3), &a).unwrap_err().to_string();
        assert_eq!(ids.refusals_of(ids.owner(JobId(1))), 1);
        assert!(
            err.contains("already has 2 open jobs") && err.contains("max-jobs=2"),
            "{err}"
        );
        // Another tenant has its own count.
        ids.open(JobId(4), &Tenant::from_uid(0)).unwrap();
        ids.forget_job(JobId(1));
        ids.open(JobId(3), &a).unwrap();

        let asked = Hints {
            priority: 9,
            ..Hints::default()
        };
        assert_eq!(ids.clamp(JobId(3), asked).priority, 3);
        assert_eq!(ids.clamp_of(JobId(3)), Some(Clamp { asked: 9, max: 3 }));
        assert_eq!(ids.clamp(JobId(3), Hints::default()).priority, 0);
        assert_eq!(ids.clamp_of(JobId(3)), None);
        // Raising the limit at run time: the clamp no longer shows for new hints.
        ids.set_limits("anonymous", &Limits::parse(["max-priority=10"]).unwrap());
        let asked = Hints {
            priority: 9,
            ..Hints::default()
        };
        assert_eq!(ids.clamp(JobId(3), asked).priority, 9);
    }

    #[test]
    fn jobs_opened_counts_jobs_already_closed_and_not_the_refused() {
        let tenant = Tenant::named("k8s-ab12");
        let mut ids = TenantIds::default();
        ids.set_limits("k8s-ab12", &Limits::parse(["max-jobs=1"]).unwrap());
        let id = ids.open(JobId(1), &tenant).unwrap();
        assert!(ids.open(JobId(2), &tenant).is_err(), "max-jobs=1 refuses");
        ids.forget_job(JobId(1));
        ids.open(JobId(3), &tenant).unwrap();
        assert_eq!(ids.jobs_opened(id), 2);
        assert_eq!(ids.jobs_opened(TenantId(99)), 0);
    }
}
