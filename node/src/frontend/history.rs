//! The admin API's view of the job history (`ListHistory`, `EraseHistory`,
//! `salus history`): who may see and erase what, and the rows.
//!
//! The history is kept by tenant key, never by display name: a token tenant
//! named `alice` and the Unix user alice are two tenants with two histories.
//! A tenant sees and erases its own identities only (naming itself, or no
//! one); an admin names any tenant (`user:NAME`, `uid:N`, `token:NAME`,
//! `anonymous`, or a bare NAME: the user and the token tenant of that name,
//! which an erasure refuses when both have a history), and sees every
//! tenant's when it names none.

use salus_proto::salus::v1::{
    EraseHistoryResponse, HistoryIdentity, HistoryRun, ListHistoryResponse,
};

use crate::error::Error;
use crate::runtime::executor::Executor;
use crate::runtime::job_history::HistoryView;
use crate::tenant::identity::{keys_named, Tenant, TenantKey};

/// Whose history a caller asks for.
pub enum Asker<'a> {
    Admin,
    Tenant(&'a Tenant),
}

/// The tenant keys whose history `asker` may reach with `requested` (empty:
/// its own, or for an admin every tenant's: None).
fn scope(asker: &Asker<'_>, requested: &str, what: &str) -> Result<Option<Vec<TenantKey>>, Error> {
    let named = || {
        keys_named(requested)
            .map_err(|why| Error::InvalidArgument(format!("{what}: tenant {requested:?}: {why}")))
    };
    match asker {
        Asker::Admin if requested.is_empty() => Ok(None),
        Asker::Admin => named().map(Some),
        Asker::Tenant(caller) if requested.is_empty() => Ok(Some(vec![caller.key.clone()])),
        // A tenant may name itself (by its name or its spelled key); what it
        // reaches is its own key only, whoever else bears the name.
        Asker::Tenant(caller) if named().is_ok_and(|keys| keys.contains(&caller.key)) => {
            Ok(Some(vec![caller.key.clone()]))
        }
        Asker::Tenant(caller) => Err(Error::PermissionDenied(format!(
            "{what} of tenant {requested:?} needs an admin; tenant {caller} may reach only its own"
        ))),
    }
}

fn texts(keys: &[TenantKey]) -> Vec<String> {
    keys.iter().map(TenantKey::to_text).collect()
}

pub fn list(
    executor: &Executor,
    asker: &Asker<'_>,
    requested: &str,
) -> Result<ListHistoryResponse, Error> {
    let keys = scope(asker, requested, "the job history")?.map(|keys| texts(&keys));
    Ok(to_proto(executor.history(keys.as_deref())))
}

pub fn erase(
    executor: &Executor,
    asker: &Asker<'_>,
    requested: &str,
) -> Result<EraseHistoryResponse, Error> {
    let Some(keys) = scope(asker, requested, "erasing the job history")? else {
        return Err(Error::InvalidArgument(
            "name the tenant whose job history to erase".into(),
        ));
    };
    // A bare name of an admin's may be two tenants: erase only what is unambiguous.
    let with_history: Vec<&TenantKey> = if keys.len() > 1 {
        let held = executor.history(Some(&texts(&keys)));
        keys.iter()
            .filter(|k| {
                held.identities
                    .iter()
                    .any(|(i, _, _)| i.tenant == k.to_text())
            })
            .collect()
    } else {
        keys.iter().collect()
    };
    let key = match with_history[..] {
        [] => return Ok(EraseHistoryResponse { identities: 0 }),
        [key] => key,
        _ => {
            let spelled: Vec<String> = with_history.iter().map(|k| k.spec()).collect();
            return Err(Error::InvalidArgument(format!(
                "{requested:?} names {} tenants with a job history ({}): name one",
                spelled.len(),
                spelled.join(", ")
            )));
        }
    };
    let identities = executor.erase_history(&key.to_text()) as u64;
    tracing::info!(tenant = %key.to_text(), identities, "job history erased");
    Ok(EraseHistoryResponse { identities })
}

/// How a history identity's tenant is shown: its key spelled for people
/// (`user:alice`, `token:alice`), which `--tenant` takes back.
fn tenant_shown(key_text: &str) -> String {
    match key_text {
        "" => String::new(),
        text => TenantKey::from_text(text).map_or_else(|_| text.to_string(), |k| k.spec()),
    }
}

fn to_proto(view: HistoryView) -> ListHistoryResponse {
    let mut shown = std::collections::HashMap::new();
    ListHistoryResponse {
        identities: view
            .identities
            .into_iter()
            .map(|(identity, runs, expected)| HistoryIdentity {
                tenant: shown
                    .entry(identity.tenant.clone())
                    .or_insert_with(|| tenant_shown(&identity.tenant))
                    .clone(),
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
        let own = Some(vec![TenantKey::Named("alice".into())]);
        assert_eq!(scope(&tenant, "", "x").unwrap(), own);
        assert_eq!(scope(&tenant, "alice", "x").unwrap(), own);
        assert_eq!(scope(&tenant, "token:alice", "x").unwrap(), own);
        let refused = scope(&tenant, "bob", "erasing the job history").unwrap_err();
        assert!(matches!(refused, Error::PermissionDenied(_)), "{refused}");
        assert_eq!(scope(&Asker::Admin, "", "x").unwrap(), None);
        assert_eq!(
            scope(&Asker::Admin, "token:bob", "x").unwrap(),
            Some(vec![TenantKey::Named("bob".into())])
        );
    }

    #[test]
    fn a_token_tenant_named_like_a_user_reaches_its_own_history_never_the_users() {
        // A token tenant named root: "root" names the user root too, yet the
        // tenant reaches only its own key; the user's spelled key is refused.
        let namesake = Tenant::named("root");
        let asker = Asker::Tenant(&namesake);
        assert_eq!(
            scope(&asker, "root", "x").unwrap(),
            Some(vec![TenantKey::Named("root".into())])
        );
        for other in ["user:root", "uid:0"] {
            let refused = scope(&asker, other, "the job history").unwrap_err();
            assert!(matches!(refused, Error::PermissionDenied(_)), "{refused}");
        }
        // And the user reaches only its own.
        let root = Tenant::from_uid(0);
        let asker = Asker::Tenant(&root);
        assert_eq!(
            scope(&asker, "root", "x").unwrap(),
            Some(vec![TenantKey::Uid(0)])
        );
        assert!(scope(&asker, "token:root", "x").is_err());
        // An admin's bare name is both; spelled, one.
        assert_eq!(
            scope(&Asker::Admin, "root", "x").unwrap(),
            Some(vec![TenantKey::Uid(0), TenantKey::Named("root".into())])
        );
        assert_eq!(tenant_shown("uid:0"), "user:root");
        assert_eq!(tenant_shown("name:root"), "token:root");
        assert_eq!(tenant_shown(""), "");
    }
}
