//! What a tenant's valid issued tokens grant, applied: its limits (weight,
//! jobs, priority) in the scheduler and the memory they reserve for its jobs
//! in memory admission. Applied when a token is issued, revoked or expires
//! (the sweep below), and for the tokens restored at start, before the first
//! connection. Whoever holds the scheduler and admission implements
//! [`GrantHolder`] (the runtime), so this module does not depend on them.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::tenant::identity::{Identifier, Tenant};
use crate::tenant::limits::Limits;
use crate::tenant::tokens::{IssuedToken, TokenStore};

/// Where grants take effect.
pub trait GrantHolder: Send + Sync {
    /// Holds `bytes` for `tenant`'s jobs (0: none), in place of its earlier
    /// reservation; fails if it does not fit. A holder without memory
    /// admission has nothing to hold.
    fn reserve(&self, tenant: &Tenant, bytes: u64) -> Result<(), Error>;
    /// `tenant`'s limits from its tokens (None: none granted).
    fn set_granted_limits(&self, tenant: &Tenant, granted: Option<Limits>);
}

/// How often expired tokens are forgotten (they are refused from the moment they expire).
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The tenant a token identifies: its Unix user, or its name.
pub fn token_tenant(token: &IssuedToken) -> Tenant {
    token
        .uid
        .map_or_else(|| Tenant::named(&token.tenant), Tenant::from_uid)
}

/// Applies what the valid tokens of `token`'s tenant grant now: their limits,
/// and their memory as a reservation. Fails if the reservation does not fit
/// (the limits are then left as they were).
pub fn apply(
    holder: &dyn GrantHolder,
    store: &TokenStore,
    token: &IssuedToken,
    now: SystemTime,
) -> Result<(), Error> {
    let tenant = token_tenant(token);
    let granted = store.limits_of(token, now);
    let reserved = granted.as_ref().and_then(|l| l.memory).unwrap_or(0);
    holder.reserve(&tenant, reserved)?;
    holder.set_granted_limits(&tenant, granted);
    Ok(())
}

/// Holds the grants of the tokens restored at start, once per tenant. A
/// reservation that no longer fits (a smaller device) is not held, and said;
/// the tokens stay valid and their other limits apply.
pub fn hold_restored(holder: &dyn GrantHolder, identifier: &Identifier) {
    let now = SystemTime::now();
    let mut done: Vec<IssuedToken> = Vec::new();
    for token in identifier.issued().list() {
        if done.iter().any(|t| t.same_tenant(&token)) {
            continue;
        }
        let granted = identifier.issued().limits_of(&token, now);
        if let Err(err) = apply(holder, identifier.issued(), &token, now) {
            tracing::error!(tenant = token.tenant, cause = %err,
                "a restored token's memory reservation does not fit this server: not held (its tokens stay valid)");
            holder.set_granted_limits(&token_tenant(&token), granted);
        } else {
            tracing::info!(tenant = token.tenant, uid = ?token.uid,
                limits = %granted.unwrap_or_default(), "restored tokens' grants held");
        }
        done.push(token);
    }
}

/// Forgets `identifier`'s expired tokens every few seconds while it lives:
/// their tenants' grants are applied again without them, and `expired` is
/// told of each (to end what only that token admitted). Runs on the async
/// runtime; the store's file is saved off it.
pub fn sweep_expired(
    identifier: Weak<Identifier>,
    holder: Arc<dyn GrantHolder>,
    expired: impl Fn(&Identifier, &IssuedToken, SystemTime) + Send + 'static,
) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            let Some(identifier) = identifier.upgrade() else {
                return;
            };
            let now = SystemTime::now();
            // Off the runtime: forgetting saves the state file (a fsync).
            let sweeping = identifier.clone();
            let gone = match tokio::task::spawn_blocking(move || sweeping.issued().sweep(now)).await
            {
                Ok(gone) => gone,
                Err(err) => {
                    tracing::error!(cause = %err, "the sweep of expired tokens failed");
                    continue;
                }
            };
            for token in gone {
                tracing::info!(id = token.id, tenant = token.tenant, "issued token expired");
                if let Err(err) = apply(holder.as_ref(), identifier.issued(), &token, now) {
                    tracing::error!(cause = %err, "cannot release an expired token's reservation");
                }
                expired(&identifier, &token, now);
            }
        }
    });
}
