//! Tokens issued at run time by an admin (`salus-server ctl token issue`), for
//! a cluster agent that places a job on this node: each names a tenant, may be
//! bound to a Unix user (then accepted only from that uid on loopback), may
//! expire, and may carry limits that apply to its tenant while it is valid.
//! Only a token's SHA-256 is kept; the token itself is printed once. Tokens
//! live in the server's memory: a restarted server knows only its tenants file.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::tenant::limits::Limits;

/// What an issued token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    /// Public name of the token (its hash's first 12 hex digits): what
    /// `ctl token list` shows and `ctl token revoke` takes.
    pub id: String,
    pub tenant: String,
    pub uid: Option<u32>,
    pub limits: Limits,
    pub issued_at: SystemTime,
    pub expires_at: Option<SystemTime>,
    sha256: [u8; 32],
}

impl IssuedToken {
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Whether both tokens identify the same tenant: one Unix user, or one
    /// name among tokens bound to no user.
    pub fn same_tenant(&self, other: &IssuedToken) -> bool {
        match (self.uid, other.uid) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.tenant == other.tenant,
            _ => false,
        }
    }
}

/// A token presented that is known but no longer valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    pub tenant: String,
    pub at: SystemTime,
}

/// Every token issued and not yet revoked.
#[derive(Debug, Default)]
pub struct TokenStore {
    tokens: Mutex<Vec<IssuedToken>>,
}

/// Tenant names a token may carry: those a tenants file line could have.
pub fn valid_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "*"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
}

impl TokenStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IssuedToken>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new token for `tenant`: the token (printed once) and its record.
    pub fn issue(
        &self,
        tenant: &str,
        uid: Option<u32>,
        limits: Limits,
        lifetime: Option<Duration>,
    ) -> std::io::Result<(String, IssuedToken)> {
        let mut secret = [0u8; 32];
        fill_random(&mut secret)?;
        let token: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let sha256: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let id: String = sha256[..6].iter().map(|b| format!("{b:02x}")).collect();
        let issued_at = SystemTime::now();
        let record = IssuedToken {
            id,
            tenant: tenant.to_string(),
            uid,
            limits,
            issued_at,
            expires_at: lifetime.map(|d| issued_at + d),
            sha256,
        };
        self.lock().push(record.clone());
        Ok((token, record))
    }

    /// The record of `token`: Ok(None) if unknown (or revoked), Err if expired.
    pub fn find(&self, token: &str, now: SystemTime) -> Result<Option<IssuedToken>, Expired> {
        let tokens = self.lock();
        match find_by_hash(&tokens, |t| &t.sha256, token) {
            Some(record) if record.expired(now) => Err(Expired {
                tenant: record.tenant.clone(),
                at: record.expires_at.unwrap_or(now),
            }),
            found => Ok(found.cloned()),
        }
    }

    /// Revokes the tokens whose id is `which`, or every token of tenant
    /// `which`; returns those revoked.
    pub fn revoke(&self, which: &str) -> Vec<IssuedToken> {
        let mut tokens = self.lock();
        let (revoked, kept) = tokens
            .drain(..)
            .partition(|t| t.id == which || t.tenant == which);
        *tokens = kept;
        revoked
    }

    /// Forgets expired tokens (they are refused already); returns them.
    pub fn sweep(&self, now: SystemTime) -> Vec<IssuedToken> {
        let mut tokens = self.lock();
        let (expired, kept) = tokens.drain(..).partition(|t| t.expired(now));
        *tokens = kept;
        expired
    }

    pub fn list(&self) -> Vec<IssuedToken> {
        self.lock().clone()
    }

    /// The limits valid tokens give the tenant `like` is for (the same Unix
    /// user, or the same name for tokens bound to none): each token is a job
    /// placed here, so their memory reservations and job counts add up, and
    /// the highest weight and priority limit apply.
    pub fn limits_of(&self, like: &IssuedToken, now: SystemTime) -> Option<Limits> {
        let tokens = self.lock();
        let mut granted: Option<Limits> = None;
        for token in tokens
            .iter()
            .filter(|t| t.same_tenant(like) && !t.expired(now))
        {
            granted = Some(match granted {
                None => token.limits.clone(),
                Some(sum) => Limits {
                    weight: max_of(sum.weight, token.limits.weight),
                    max_jobs: sum_of(sum.max_jobs, token.limits.max_jobs),
                    max_priority: max_of(sum.max_priority, token.limits.max_priority),
                    memory: sum_of(sum.memory, token.limits.memory),
                },
            });
        }
        granted
    }
}

fn max_of<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn sum_of<T: std::ops::Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// The item whose stored SHA-256 is `token`'s. Every item is compared whole,
/// so the time taken says nothing about how close a wrong token came.
pub fn find_by_hash<'a, T>(
    items: &'a [T],
    hash: impl Fn(&T) -> &[u8; 32],
    token: &str,
) -> Option<&'a T> {
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let mut found = None;
    for item in items {
        let diff = hash(item)
            .iter()
            .zip(digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            found = Some(item);
        }
    }
    found
}

fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the remaining length into `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_are_found_by_the_token_and_revoked_by_id_or_tenant() {
        let store = TokenStore::default();
        let now = SystemTime::now();
        let (token, record) = store
            .issue("job-1", Some(1001), Limits::default(), None)
            .unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(record.id.len(), 12);
        assert!(
            !token.contains(&record.id),
            "the id is of the hash, not the token"
        );
        assert_eq!(store.find(&token, now).unwrap().unwrap().uid, Some(1001));
        assert_eq!(store.find("nope", now), Ok(None));
        let (other, _) = store.issue("job-1", None, Limits::default(), None).unwrap();
        assert_ne!(token, other);
        assert_eq!(store.revoke(&record.id).len(), 1);
        assert_eq!(store.find(&token, now), Ok(None));
        assert!(store.find(&other, now).unwrap().is_some());
        assert_eq!(store.revoke("job-1").len(), 1);
        assert!(store.list().is_empty());
    }

    #[test]
    fn expired_tokens_are_refused_then_swept() {
        let store = TokenStore::default();
        let (token, record) = store
            .issue(
                "job-2",
                None,
                Limits::parse(["max-priority=2"]).unwrap(),
                Some(Duration::from_secs(60)),
            )
            .unwrap();
        let before = record.issued_at + Duration::from_secs(59);
        let after = record.issued_at + Duration::from_secs(60);
        assert!(store.find(&token, before).unwrap().is_some());
        assert_eq!(
            store.limits_of(&record, before).unwrap().max_priority,
            Some(2)
        );
        let expired = store.find(&token, after).unwrap_err();
        assert_eq!(expired.tenant, "job-2");
        assert_eq!(store.limits_of(&record, after), None);
        assert_eq!(store.sweep(after).len(), 1);
        assert_eq!(store.find(&token, after), Ok(None));
    }

    #[test]
    fn tokens_of_one_user_add_up_their_memory_and_jobs() {
        let store = TokenStore::default();
        let limits = |f: &[&str]| Limits::parse(f.iter().copied()).unwrap();
        let (_, first) = store
            .issue(
                "alice",
                Some(1001),
                limits(&["memory=1GiB", "max-jobs=2", "max-priority=1"]),
                None,
            )
            .unwrap();
        store
            .issue(
                "slurm-7",
                Some(1001),
                limits(&["memory=2GiB", "max-jobs=1", "max-priority=3"]),
                None,
            )
            .unwrap();
        store
            .issue("alice", None, limits(&["memory=8G"]), None)
            .unwrap();
        let granted = store.limits_of(&first, SystemTime::now()).unwrap();
        assert_eq!(granted.memory, Some(3 << 30));
        assert_eq!(granted.max_jobs, Some(3));
        assert_eq!(granted.max_priority, Some(3));
        assert_eq!(granted.weight, None);
    }

    #[test]
    fn tenant_names_are_checked() {
        assert!(valid_tenant_name("slurm-1234.0@node1"));
        for bad in ["", "*", "a b", "x\n", &"y".repeat(65)] {
            assert!(!valid_tenant_name(bad), "{bad:?}");
        }
    }
}
