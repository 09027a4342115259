//! The tenants in the scheduler core: their numbers, limits (file, admin,
//! granted by a token) and weights, their jobs' memory share, refusals and
//! priority clamps, and the figures the admin API shows.

use crate::runtime::tenant_ids::Clamp;
use crate::sched::tenants::DEFAULT_WEIGHT;
use crate::sched::{JobId, TenantId, TenantStatus};
use crate::tenant::identity::Tenant;
use crate::tenant::limits::{Limits, LimitsTable};

use super::{Executor, Inner};

/// One tenant's figures in the scheduler.
#[derive(Clone, Debug)]
pub struct TenantFigures {
    pub tenant: Tenant,
    pub status: TenantStatus,
    pub limits: Limits,
    /// Its jobs and memory requests refused so far.
    pub refusals: u64,
}

/// Every known tenant's weight from its limits, into the scheduler core.
pub(super) fn apply_weights(inner: &mut Inner) {
    let weights: Vec<(TenantId, u32)> = inner
        .tenants
        .known()
        .map(|(id, _)| {
            let weight = inner.tenants.limits_of(id).weight;
            (id, weight.unwrap_or(DEFAULT_WEIGHT))
        })
        .collect();
    for (id, weight) in weights {
        let _ = inner.sched.set_tenant_weight(id, weight);
    }
}

impl Executor {
    /// Replaces the limits the tenants file gives (a reload), keeping those
    /// issued tokens grant; limits changed with `salus limits` are re-applied
    /// by the caller.
    pub fn replace_file_limits(&self, limits: LimitsTable) {
        let mut inner = self.shared.lock();
        inner.tenants.replace_file_limits(limits);
        apply_weights(&mut inner);
        drop(inner);
        self.shared.wake.notify_all();
    }

    /// The tenants' limits (the tenants file's, at start).
    pub fn set_limits_table(&self, limits: LimitsTable) {
        let mut inner = self.shared.lock();
        inner.tenants.set_limits_table(limits);
        apply_weights(&mut inner);
    }

    /// Changes the limits of the tenant named `name` (`*`: the defaults); the
    /// fields set replace its earlier ones. Weights apply at once, max-jobs to
    /// the next job opened, max-priority to the next hints set.
    /// Returns the limits that now apply to `name`.
    pub fn set_limits(&self, name: &str, limits: &Limits) -> Limits {
        let mut inner = self.shared.lock();
        inner.tenants.set_limits(name, limits);
        apply_weights(&mut inner);
        let now = inner.tenants.limits_named(name);
        drop(inner);
        self.shared.wake.notify_all();
        now
    }

    /// The limits valid issued tokens give tenant `name` (None: none now).
    pub fn set_granted_limits(&self, name: &str, granted: Option<Limits>) {
        let mut inner = self.shared.lock();
        inner.tenants.set_granted(name, granted);
        apply_weights(&mut inner);
        drop(inner);
        self.shared.wake.notify_all();
    }

    /// The owner of `job`, its memory share (`memory=` limit) if it has one,
    /// and its name (for admission).
    pub fn memory_share(&self, job: JobId) -> (TenantId, Option<u64>, String) {
        let inner = self.shared.lock();
        let owner = inner.tenants.owner(job);
        let name = inner
            .tenants
            .tenant(owner)
            .map_or_else(|| "anonymous".to_string(), |t| t.to_string());
        (owner, inner.tenants.limits_of(owner).memory, name)
    }

    /// The scheduler core's number for `tenant` (numbered on first sight).
    /// `tenant`'s executor runs again after a stop: the device time it gave
    /// up meanwhile is not credit against the tenants that went on.
    pub fn forfeit_credit(&self, tenant: &Tenant) {
        let now = self.shared.now();
        let mut inner = self.shared.lock();
        let id = inner.tenants.id_of(tenant);
        inner.sched.forfeit_credit(id, now);
    }

    pub fn tenant_id(&self, tenant: &Tenant) -> TenantId {
        self.shared.lock().tenants.id_of(tenant)
    }

    /// Jobs `tenant` has opened since start, closed ones included.
    pub fn jobs_opened(&self, tenant: TenantId) -> u64 {
        self.shared.lock().tenants.jobs_opened(tenant)
    }

    /// Counts a refusal (memory admission) against `job`'s owner.
    pub fn count_refusal(&self, job: JobId) {
        self.shared.lock().tenants.refused(job);
    }

    /// Whether `job`'s priority hint was lowered to its tenant's limit.
    pub fn priority_clamp(&self, job: JobId) -> Option<Clamp> {
        self.shared.lock().tenants.clamp_of(job)
    }

    /// Every tenant that has had a job here, with its share of device time.
    pub fn tenant_figures(&self) -> Vec<TenantFigures> {
        let inner = self.shared.lock();
        inner
            .sched
            .tenant_status()
            .into_iter()
            .filter_map(|status| {
                let tenant = inner.tenants.tenant(status.id)?.clone();
                let limits = inner.tenants.limits_of(status.id);
                let refusals = inner.tenants.refusals_of(status.id);
                Some(TenantFigures {
                    tenant,
                    status,
                    limits,
                    refusals,
                })
            })
            .collect()
    }
}
