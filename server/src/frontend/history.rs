//! The admin API's view of the job history (`ListHistory`, `EraseHistory`,
//! `salus-server ctl history`): who may see and erase what, and the rows.
//!
//! A tenant sees and erases its own identities (those under its name); an
//! admin names any tenant, and sees every tenant's when it names none.

use salus_proto::salus::v1::{
    EraseHistoryResponse, HistoryIdentity, HistoryRun, ListHistoryResponse,
};

use crate::error::Error;
use crate::runtime::executor::Executor;
use crate::runtime::job_history::HistoryView;
use crate::tenant::identity::Tenant;

/// Whose history a caller asks for.
pub enum Asker<'a> {
    Admin,
    Tenant(&'a Tenant),
}

/// The tenant whose history `asker` may reach with `requested` (empty: its
/// own, or for an admin every tenant's when `all_allowed`).
fn scope<'a>(
    asker: &'a Asker<'a>,
    requested: &'a str,
    what: &str,
) -> Result<Option<&'a str>, Error> {
    match asker {
        Asker::Admin if requested.is_empty() => Ok(None),
        Asker::Admin => Ok(Some(requested)),
        Asker::Tenant(caller) if requested.is_empty() || requested == caller.name => {
            Ok(Some(caller.name.as_str()))
        }
        Asker::Tenant(caller) => Err(Error::PermissionDenied(format!(
            "{what} of tenant {requested:?} needs an admin; tenant {caller} may reach only its own"
        ))),
    }
}

pub fn list(
    executor: &Executor,
    asker: &Asker<'_>,
    requested: &str,
) -> Result<ListHistoryResponse, Error> {
    let tenant = scope(asker, requested, "the job history")?;
    Ok(to_proto(executor.history(tenant)))
}

pub fn erase(
    executor: &Executor,
    asker: &Asker<'_>,
    requested: &str,
) -> Result<EraseHistoryResponse, Error> {
    let Some(tenant) = scope(asker, requested, "erasing the job history")? else {
        return Err(Error::InvalidArgument(
            "name the tenant whose job history to erase".into(),
        ));
    };
    let identities = executor.erase_history(tenant) as u64;
    tracing::info!(tenant, identities, "job history erased");
    Ok(EraseHistoryResponse { identities })
}

fn to_proto(view: HistoryView) -> ListHistoryResponse {
    ListHistoryResponse {
        identities: view
            .identities
            .into_iter()
            .map(|(identity, runs, expected)| HistoryIdentity {
                tenant: identity.tenant,
                name: identity.name,
                fingerprint: identity.fingerprint.unwrap_or_default(),
                runs: runs
                    .iter()
                    .map(|run| HistoryRun {
                        device_seconds: run.device_s,
                        iterations: run.iterations,
                        end: run.end.name().into(),
                    })
                    .collect(),
                expected_seconds: expected.map_or(0.0, |e| e.median_s),
                sigma: expected.map_or(0.0, |e| e.sigma),
                completed_runs: expected.map_or(0, |e| e.runs as u32),
            })
            .collect(),
        max_identities: view.max_identities as u32,
        max_runs: view.max_runs as u32,
        file: view
            .file
            .map(|f| f.display().to_string())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_reaches_only_its_own_history_and_an_admin_any() {
        let alice = Tenant::named("alice");
        let tenant = Asker::Tenant(&alice);
        assert_eq!(scope(&tenant, "", "x").unwrap(), Some("alice"));
        assert_eq!(scope(&tenant, "alice", "x").unwrap(), Some("alice"));
        let refused = scope(&tenant, "bob", "erasing the job history").unwrap_err();
        assert!(matches!(refused, Error::PermissionDenied(_)), "{refused}");
        assert_eq!(scope(&Asker::Admin, "", "x").unwrap(), None);
        assert_eq!(scope(&Asker::Admin, "bob", "x").unwrap(), Some("bob"));
    }
}
