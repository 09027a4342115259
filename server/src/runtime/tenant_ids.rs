//! The scheduler core numbers tenants ([`TenantId`]); this maps the server's
//! tenants to those numbers and remembers which tenant owns each job, so a job
//! joins the core as its tenant's whichever path admits it.

use std::collections::HashMap;

use crate::sched::{JobId, TenantId};
use crate::tenant::identity::{Tenant, TenantKey};

#[derive(Default)]
pub struct TenantIds {
    ids: HashMap<TenantKey, TenantId>,
    /// Indexed by id - 1: the tenant as first seen (its name for figures).
    tenants: Vec<Tenant>,
    owners: HashMap<JobId, TenantId>,
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

    pub fn set_owner(&mut self, job: JobId, tenant: &Tenant) {
        let id = self.id_of(tenant);
        self.owners.insert(job, id);
    }

    /// The owner of `job`, or [`TenantId::NONE`] for a job opened without one.
    pub fn owner(&self, job: JobId) -> TenantId {
        self.owners.get(&job).copied().unwrap_or(TenantId::NONE)
    }

    pub fn forget_job(&mut self, job: JobId) {
        self.owners.remove(&job);
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

    #[test]
    fn tenants_are_numbered_once_and_jobs_keep_their_owner() {
        let mut ids = TenantIds::default();
        let a = Tenant::from_uid(0);
        let b = Tenant::anonymous();
        assert_eq!(ids.id_of(&a), TenantId(1));
        assert_eq!(ids.id_of(&b), TenantId(2));
        assert_eq!(ids.id_of(&a), TenantId(1));
        ids.set_owner(JobId(7), &b);
        assert_eq!(ids.owner(JobId(7)), TenantId(2));
        assert_eq!(ids.owner(JobId(8)), TenantId::NONE);
        assert_eq!(ids.tenant(TenantId(2)), Some(&b));
        assert_eq!(ids.tenant(TenantId::NONE), None);
        assert_eq!(ids.find(&TenantKey::Anonymous), Some(TenantId(2)));
        ids.forget_job(JobId(7));
        assert_eq!(ids.owner(JobId(7)), TenantId::NONE);
    }
}
