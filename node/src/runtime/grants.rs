//! The scheduler and memory admission as the holder of tenants' grants
//! (`tenant::grants`): limits go to the executor's tenant table, memory to a
//! reservation in admission.

use crate::error::Error;
use crate::runtime::admission::Admission;
use crate::runtime::executor::Executor;
use crate::tenant::grants::GrantHolder;
use crate::tenant::identity::Tenant;
use crate::tenant::limits::Limits;

/// Handles to the two (cheap clones).
pub struct RuntimeGrants {
    pub executor: Executor,
    pub admission: Option<Admission>,
}

impl GrantHolder for RuntimeGrants {
    fn reserve(&self, tenant: &Tenant, bytes: u64) -> Result<(), Error> {
        match &self.admission {
            Some(admission) => admission.reserve(self.executor.tenant_id(tenant), bytes),
            None => Ok(()),
        }
    }

    fn set_granted_limits(&self, tenant: &Tenant, granted: Option<Limits>) {
        self.executor.set_granted_limits(&tenant.name, granted);
    }
}
