//! Tokens issued at run time by an admin (`salus token issue`), for
//! a cluster agent that places a job on this node: each names a tenant, may be
//! bound to a Unix user (then accepted only from that uid on loopback), may
//! expire, and may carry limits that apply to its tenant while it is valid.
//! Only a token's SHA-256 is kept; the token itself is printed once. With a
//! state directory ([`TokenStore::restore`]) the records are saved there
//! (`tokens.json`) after every change, so a restarted server accepts the
//! tokens it issued before (a Slurm job's, a pod's) and holds their
//! reservations again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::sched::tenants::MAX_WEIGHT;
use crate::state_dir::{Dropped, Loaded, StateDir, StateDirError, StateDocument};
use crate::tenant::limits::Limits;

/// What an issued token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    /// Public name of the token (its hash's first 12 hex digits): what
    /// `salus token list` shows and `salus token revoke` takes.
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
    /// Where the tokens are saved (None: in memory only, e.g. an executor's store).
    durable: Option<Durable>,
}

#[derive(Debug)]
struct Durable {
    dir: Arc<StateDir>,
    /// Held while a snapshot is taken and written, so that saves land in the
    /// order of the changes they follow (the last write is the newest state)
    /// without holding the token lock, which identifies requests, over a fsync.
    saving: Mutex<()>,
}

/// Why a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("cannot draw a random token: {0}")]
    Random(std::io::Error),
    #[error(
        "the token was not issued: it could not be saved, so it would not outlive a restart ({0})"
    )]
    Save(StateDirError),
}

/// Which issued tokens [`TokenStore::revoke`] revokes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoke<'a> {
    /// The token of this id.
    Id(&'a str),
    /// Every token of the tenant of this name.
    Tenant(&'a str),
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
    /// With a state directory it is saved before it is returned (blocks on a
    /// fsync: call it off the async runtime).
    pub fn issue(
        &self,
        tenant: &str,
        uid: Option<u32>,
        limits: Limits,
        lifetime: Option<Duration>,
    ) -> Result<(String, IssuedToken), IssueError> {
        let mut secret = [0u8; 32];
        fill_random(&mut secret).map_err(IssueError::Random)?;
        let token: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let sha256: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let id = id_of(&sha256);
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
        if let Err(err) = self.save() {
            // Never handed out: forget it again.
            self.lock().retain(|t| t.id != record.id);
            self.save_or_log("a token that could not be saved was forgotten");
            return Err(IssueError::Save(err));
        }
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

    /// Revokes the token of an id, or every token of a tenant (never
    /// both: a tenant may be named like another token's id); returns those
    /// revoked. In memory whatever happens; saved (blocks on a fsync) or, if
    /// saving fails, logged: the token would come back after a restart.
    pub fn revoke(&self, which: Revoke<'_>) -> Vec<IssuedToken> {
        let mut tokens = self.lock();
        let (revoked, kept): (Vec<IssuedToken>, _) = tokens.drain(..).partition(|t| match which {
            Revoke::Id(id) => t.id == id,
            Revoke::Tenant(tenant) => t.tenant == tenant,
        });
        *tokens = kept;
        drop(tokens);
        if !revoked.is_empty() {
            self.save_or_log("tokens revoked");
        }
        revoked
    }

    /// Forgets expired tokens (they are refused already); returns them. Saved
    /// like [`TokenStore::revoke`].
    pub fn sweep(&self, now: SystemTime) -> Vec<IssuedToken> {
        let mut tokens = self.lock();
        let (expired, kept): (Vec<IssuedToken>, _) = tokens.drain(..).partition(|t| t.expired(now));
        *tokens = kept;
        drop(tokens);
        if !expired.is_empty() {
            self.save_or_log("expired tokens forgotten");
        }
        expired
    }

    pub fn list(&self) -> Vec<IssuedToken> {
        self.lock().clone()
    }

    /// A store saved in `dir`, with the tokens saved there before: those
    /// still valid at `now` (expired ones are dropped, and said so in the
    /// report). A file that cannot be used is moved aside and reported; the
    /// store then starts empty. Reads and writes files: call it off the async
    /// runtime.
    pub fn restore(dir: Arc<StateDir>, now: SystemTime) -> (TokenStore, RestoreReport) {
        let mut report = RestoreReport {
            file: dir.file_of::<SavedTokens>(),
            ..RestoreReport::default()
        };
        let mut tokens: Vec<IssuedToken> = Vec::new();
        match dir.load::<SavedTokens>() {
            Loaded::Missing => {}
            Loaded::Dropped(dropped) => report.dropped_file = Some(dropped),
            Loaded::Restored(saved) => {
                for entry in saved.tokens {
                    let id = entry.id.clone();
                    match entry.into_record() {
                        Err(why) => report.rejected.push((id, why)),
                        Ok(record) if tokens.iter().any(|t| t.sha256 == record.sha256) => {
                            report.rejected.push((id, "listed twice".into()))
                        }
                        Ok(record) if record.expired(now) => report.expired.push(record),
                        Ok(record) => tokens.push(record),
                    }
                }
                if !report.rejected.is_empty() {
                    match dir.keep_copy(&report.file) {
                        Ok(kept) => report.kept_copy = Some(kept),
                        Err(err) => report.copy_failed = Some(err.to_string()),
                    }
                }
            }
        }
        report.restored = tokens.clone();
        let store = TokenStore {
            tokens: Mutex::new(tokens),
            durable: Some(Durable {
                dir,
                saving: Mutex::new(()),
            }),
        };
        if report.changed() {
            // The file says what memory holds from now on.
            store.save_or_log("tokens dropped at start");
        }
        (store, report)
    }

    /// Writes the tokens as they are now to the state directory (if any).
    fn save(&self) -> Result<(), StateDirError> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let _saving = durable.saving.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = SavedTokens {
            tokens: self.lock().iter().map(SavedToken::of).collect(),
        };
        durable.dir.save(&snapshot)
    }

    fn save_or_log(&self, after: &str) {
        if let Err(err) = self.save() {
            tracing::error!(cause = %err, after,
                "cannot save the issued tokens: a restart would bring back the state last saved");
        }
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

/// What [`TokenStore::restore`] found in the state directory.
#[derive(Debug, Default)]
pub struct RestoreReport {
    /// The tokens file.
    pub file: std::path::PathBuf,
    /// Tokens valid again.
    pub restored: Vec<IssuedToken>,
    /// Tokens that expired while the server was down: dropped.
    pub expired: Vec<IssuedToken>,
    /// Entries dropped, by id, and why (a tenant name or hash no server writes).
    pub rejected: Vec<(String, String)>,
    /// Where the file is kept as it was, when entries were rejected.
    pub kept_copy: Option<std::path::PathBuf>,
    pub copy_failed: Option<String>,
    /// The whole file, when it could not be used.
    pub dropped_file: Option<Dropped>,
}

impl RestoreReport {
    /// Whether the store holds less than the file did.
    fn changed(&self) -> bool {
        !self.expired.is_empty() || !self.rejected.is_empty() || self.dropped_file.is_some()
    }

    /// Logs what was restored and, one line each, what was dropped and why.
    pub fn log(&self) {
        let file = self.file.display();
        if let Some(dropped) = &self.dropped_file {
            tracing::error!(file = %dropped.file.display(), why = dropped.why,
                kept_as = ?dropped.kept_as, "the issued tokens file cannot be used: every token issued \
                before this start is dropped (their jobs are refused; issue them again)");
        }
        for (id, why) in &self.rejected {
            tracing::error!(%file, id, why, "an issued token in the state file is dropped");
        }
        if !self.rejected.is_empty() {
            match (&self.kept_copy, &self.copy_failed) {
                (Some(kept), _) => {
                    tracing::warn!(%file, kept_as = %kept.display(), "the file as it was is kept")
                }
                (None, Some(err)) => {
                    tracing::warn!(%file, cause = err, "no copy of the file as it was could be kept")
                }
                (None, None) => {}
            }
        }
        for token in &self.expired {
            tracing::info!(%file, id = token.id, tenant = token.tenant,
                expired_unix_s = token.expires_at.map_or(0, crate::state_dir::unix_seconds),
                "an issued token expired while the server was down: dropped");
        }
        tracing::info!(%file, restored = self.restored.len(), expired = self.expired.len(),
            rejected = self.rejected.len(), "issued tokens restored from the state directory");
    }
}

/// `tokens.json`: the records of the issued tokens (hashes, never tokens).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTokens {
    pub tokens: Vec<SavedToken>,
}

impl StateDocument for SavedTokens {
    const FILE: &'static str = "tokens.json";
    const VERSION: u32 = 1;
    const WHAT: &'static str = "issued tokens";
}

/// One token as saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedToken {
    pub id: String,
    pub tenant: String,
    pub uid: Option<u32>,
    /// The token's SHA-256, 64 hex digits.
    pub sha256: String,
    pub issued_unix_ms: u64,
    pub expires_unix_ms: Option<u64>,
    pub weight: Option<u32>,
    pub max_jobs: Option<u32>,
    pub max_priority: Option<i32>,
    pub memory_bytes: Option<u64>,
}

impl SavedToken {
    fn of(token: &IssuedToken) -> SavedToken {
        SavedToken {
            id: token.id.clone(),
            tenant: token.tenant.clone(),
            uid: token.uid,
            sha256: token.sha256.iter().map(|b| format!("{b:02x}")).collect(),
            issued_unix_ms: unix_ms(token.issued_at),
            expires_unix_ms: token.expires_at.map(unix_ms),
            weight: token.limits.weight,
            max_jobs: token.limits.max_jobs,
            max_priority: token.limits.max_priority,
            memory_bytes: token.limits.memory,
        }
    }

    /// The record, if the entry is one this server could have written.
    fn into_record(self) -> Result<IssuedToken, String> {
        if !valid_tenant_name(&self.tenant) {
            return Err(format!(
                "tenant name {:?} is not one a token may carry",
                self.tenant
            ));
        }
        let sha256 = parse_sha256(&self.sha256)
            .ok_or_else(|| "its sha256 is not 64 hex digits".to_string())?;
        let id = id_of(&sha256);
        if self.id != id {
            return Err(format!("its id is not its hash's ({id})"));
        }
        if self.weight.is_some_and(|w| !(1..=MAX_WEIGHT).contains(&w)) {
            return Err(format!("weight {:?} is not 1 to {MAX_WEIGHT}", self.weight));
        }
        let at = |ms: u64| UNIX_EPOCH.checked_add(Duration::from_millis(ms));
        let issued_at = at(self.issued_unix_ms).ok_or("its issue time is out of range")?;
        let expires_at = match self.expires_unix_ms {
            None => None,
            Some(ms) => Some(at(ms).ok_or("its expiry is out of range")?),
        };
        Ok(IssuedToken {
            id,
            tenant: self.tenant,
            uid: self.uid,
            limits: Limits {
                weight: self.weight,
                max_jobs: self.max_jobs,
                max_priority: self.max_priority,
                memory: self.memory_bytes,
            },
            issued_at,
            expires_at,
            sha256,
        })
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A token's public name: its hash's first 12 hex digits.
fn id_of(sha256: &[u8; 32]) -> String {
    sha256[..6].iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
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
        assert_eq!(store.revoke(Revoke::Id(&record.id)).len(), 1);
        assert_eq!(store.find(&token, now), Ok(None));
        assert!(store.find(&other, now).unwrap().is_some());
        assert_eq!(
            store.revoke(Revoke::Id("job-1")).len(),
            0,
            "a tenant's name is no id"
        );
        assert_eq!(store.revoke(Revoke::Tenant("job-1")).len(), 1);
        assert!(store.list().is_empty());
    }

    #[test]
    fn revoking_by_tenant_never_matches_a_token_id_nor_by_id_a_tenant() {
        let store = TokenStore::default();
        let (_, victim) = store
            .issue("victim", None, Limits::default(), None)
            .unwrap();
        // A tenant named exactly like the victim's token id.
        let (_, namesake) = store
            .issue(&victim.id, None, Limits::default(), None)
            .unwrap();
        let revoked = store.revoke(Revoke::Tenant(&victim.id));
        assert_eq!(
            revoked.iter().map(|t| &t.id).collect::<Vec<_>>(),
            [&namesake.id]
        );
        assert_eq!(
            store.list().iter().map(|t| &t.id).collect::<Vec<_>>(),
            [&victim.id]
        );
        let (_, namesake) = store
            .issue(&victim.id, None, Limits::default(), None)
            .unwrap();
        let revoked = store.revoke(Revoke::Id(&victim.id));
        assert_eq!(
            revoked.iter().map(|t| &t.id).collect::<Vec<_>>(),
            [&victim.id]
        );
        assert_eq!(
            store.list().iter().map(|t| &t.id).collect::<Vec<_>>(),
            [&namesake.id]
        );
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

    fn durable(dir: &std::path::Path) -> (TokenStore, RestoreReport) {
        let dir = Arc::new(StateDir::open(dir).unwrap());
        TokenStore::restore(dir, SystemTime::now())
    }

    #[test]
    fn saved_tokens_come_back_with_their_limits_and_hashes_only() {
        let path = crate::state_dir::temp_dir("tokens");
        let limits =
            Limits::parse(["memory=1GiB", "max-jobs=2", "max-priority=3", "weight=7"]).unwrap();
        let (token, record, kept_token) = {
            let (store, report) = durable(&path);
            assert!(report.restored.is_empty() && report.dropped_file.is_none());
            let (token, record) = store
                .issue(
                    "slurm-7",
                    Some(1001),
                    limits.clone(),
                    Some(Duration::from_secs(3600)),
                )
                .unwrap();
            let (kept_token, _) = store.issue("pod-1", None, Limits::default(), None).unwrap();
            let (_, gone) = store.issue("gone", None, Limits::default(), None).unwrap();
            store.revoke(Revoke::Id(&gone.id));
            (token, record, kept_token)
        };
        let text = std::fs::read_to_string(path.join("tokens.json")).unwrap();
        assert!(
            !text.contains(&token) && !text.contains(&kept_token),
            "never the token itself"
        );
        assert!(
            text.contains(&record.id) && !text.contains("gone"),
            "{text}"
        );

        let (store, report) = durable(&path);
        assert_eq!(report.restored.len(), 2);
        assert!(report.expired.is_empty() && report.rejected.is_empty());
        let now = SystemTime::now();
        let found = store.find(&token, now).unwrap().unwrap();
        assert_eq!(found.tenant, "slurm-7");
        assert_eq!(found.uid, Some(1001));
        assert_eq!(found.limits, limits);
        assert_eq!(found.id, record.id);
        let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis();
        assert_eq!(ms(found.issued_at), ms(record.issued_at));
        assert_eq!(found.expires_at.map(ms), record.expires_at.map(ms));
        assert_eq!(
            store.find(&kept_token, now).unwrap().unwrap().tenant,
            "pod-1"
        );
        assert_eq!(store.limits_of(&found, now).unwrap().memory, Some(1 << 30));
        drop(store);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn tokens_that_expired_while_down_are_dropped_and_the_file_says_so() {
        let path = crate::state_dir::temp_dir("expired");
        let (token, lasting) = {
            let (store, _) = durable(&path);
            let (token, _) = store
                .issue(
                    "brief",
                    None,
                    Limits::default(),
                    Some(Duration::from_millis(1)),
                )
                .unwrap();
            let (lasting, _) = store
                .issue("lasting", None, Limits::default(), None)
                .unwrap();
            (token, lasting)
        };
        std::thread::sleep(Duration::from_millis(5));
        {
            let (store, report) = durable(&path);
            assert_eq!(report.expired.len(), 1);
            assert_eq!(report.expired[0].tenant, "brief");
            assert_eq!(report.restored.len(), 1);
            assert_eq!(
                store.find(&token, SystemTime::now()),
                Ok(None),
                "forgotten, not restored"
            );
            assert!(store.find(&lasting, SystemTime::now()).unwrap().is_some());
        }
        // Saved without it at once: the next start has nothing to drop.
        let (_, report) = durable(&path);
        assert!(report.expired.is_empty() && report.restored.len() == 1);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn revocations_and_sweeps_are_saved() {
        let path = crate::state_dir::temp_dir("sweep");
        let saved_ids = || -> Vec<String> {
            let text = std::fs::read(path.join("tokens.json")).unwrap();
            let doc: serde_json::Value = serde_json::from_slice(&text).unwrap();
            doc["data"]["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_string())
                .collect()
        };
        let (store, _) = durable(&path);
        let (_, brief) = store
            .issue(
                "brief",
                None,
                Limits::default(),
                Some(Duration::from_secs(1)),
            )
            .unwrap();
        let (_, kept) = store.issue("kept", None, Limits::default(), None).unwrap();
        let (_, revoked) = store
            .issue("revoked", None, Limits::default(), None)
            .unwrap();
        assert_eq!(saved_ids(), [brief.id.clone(), kept.id.clone(), revoked.id]);
        store.revoke(Revoke::Tenant("revoked"));
        assert_eq!(saved_ids(), [brief.id.clone(), kept.id.clone()]);
        assert_eq!(
            store.sweep(brief.issued_at + Duration::from_secs(1)).len(),
            1
        );
        assert_eq!(saved_ids(), [kept.id]);
        drop(store);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn a_corrupt_file_is_kept_aside_and_the_store_starts_empty() {
        let path = crate::state_dir::temp_dir("corrupt-tokens");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(
            path.join("tokens.json"),
            b"{\"version\": 1, \"data\": {\"tok",
        )
        .unwrap();
        let (store, report) = durable(&path);
        assert!(store.list().is_empty());
        let dropped = report.dropped_file.clone().unwrap();
        assert_eq!(dropped.file, path.join("tokens.json"));
        assert!(dropped.why.contains("not a state file"), "{}", dropped.why);
        let kept = dropped.kept_as.unwrap();
        assert_eq!(
            std::fs::read(&kept).unwrap(),
            b"{\"version\": 1, \"data\": {\"tok"
        );
        // The file was written anew (empty), so the next start is quiet.
        drop(store);
        let (_, report) = durable(&path);
        assert!(report.dropped_file.is_none());
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn entries_no_server_writes_are_dropped_one_by_one_and_the_file_kept() {
        let path = crate::state_dir::temp_dir("bad-entries");
        let good = {
            let (store, _) = durable(&path);
            store
                .issue("good", None, Limits::default(), None)
                .unwrap()
                .0
        };
        let file = path.join("tokens.json");
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let entry = doc["data"]["tokens"][0].clone();
        let bad = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut e = entry.clone();
            f(&mut e);
            e
        };
        let tokens = doc["data"]["tokens"].as_array_mut().unwrap();
        tokens.push(bad(&|e| e["tenant"] = "two words".into()));
        tokens.push(bad(&|e| e["sha256"] = "zz".into()));
        tokens.push(bad(&|e| e["id"] = "000000000000".into()));
        tokens.push(bad(&|e| e["weight"] = 0.into()));
        tokens.push(entry.clone());
        std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();
        let (store, report) = durable(&path);
        let whys: Vec<&str> = report
            .rejected
            .iter()
            .map(|(_, why)| why.as_str())
            .collect();
        assert_eq!(whys.len(), 5, "{whys:?}");
        for (i, part) in [
            "tenant name",
            "sha256",
            "its id is not",
            "weight",
            "listed twice",
        ]
        .iter()
        .enumerate()
        {
            assert!(whys[i].contains(part), "{whys:?}");
        }
        assert!(store.find(&good, SystemTime::now()).unwrap().is_some());
        let kept = report.kept_copy.clone().unwrap();
        assert!(std::fs::read_to_string(kept).unwrap().contains("two words"));
        drop(store);
        let _ = std::fs::remove_dir_all(&path);
    }

    #[test]
    fn tenant_names_are_checked() {
        assert!(valid_tenant_name("slurm-1234.0@node1"));
        for bad in ["", "*", "a b", "x\n", &"y".repeat(65)] {
            assert!(!valid_tenant_name(bad), "{bad:?}");
        }
    }
}
