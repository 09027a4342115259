//! Uids of their own for tenants that are no Unix user (token tenants whose
//! user is `-`): when the server runs as root, each such tenant's executor
//! runs as a uid drawn from `--tenant-uid-range`, so two of them never share
//! a uid (a process may signal and ptrace another of its own uid). A uid is
//! given to a tenant's identity ([`TenantKey`]) once and kept in the state
//! directory (`tenant-uids.json`), so the same tenant gets the same uid after
//! a restart: its checkpoint directory stays its own, and an executor adopted
//! after a restart is checked against it.
//!
//! A uid the user database knows (as a user, or as a group: the executor's
//! gid is the same number) is skipped, so a tenant never runs as a real
//! user. When every uid of the range is taken, a new tenant is refused,
//! saying so.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::state_dir::{Loaded, StateDir, StateDocument};
use crate::tenant::identity::TenantKey;

/// `--tenant-uid-range`'s default: the start of the range systemd documents
/// as unused (1879048192 to 2147483646, above the containers' range and
/// useradd's subordinate uids), 65536 uids.
pub const DEFAULT_RANGE: &str = "1879048192-1879113727";

/// An inclusive range of uids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl UidRange {
    /// `FIRST-LAST`, both included; neither root nor `nobody` nor -1 inside.
    pub fn parse(text: &str) -> Result<UidRange, String> {
        let bad =
            || format!("--tenant-uid-range {text:?}: expected FIRST-LAST, e.g. {DEFAULT_RANGE}");
        let (first, last) = text.trim().split_once('-').ok_or_else(bad)?;
        let first: u32 = first.trim().parse().map_err(|_| bad())?;
        let last: u32 = last.trim().parse().map_err(|_| bad())?;
        if first > last {
            return Err(format!("--tenant-uid-range {text:?}: FIRST is above LAST"));
        }
        if first == 0 || last == u32::MAX || (first..=last).contains(&65534) {
            return Err(format!(
                "--tenant-uid-range {text:?} includes root, nobody (65534) or 4294967295: \
                 choose uids no account uses, e.g. {DEFAULT_RANGE}"
            ));
        }
        Ok(UidRange { first, last })
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl Default for UidRange {
    fn default() -> Self {
        UidRange::parse(DEFAULT_RANGE).expect("the default range parses")
    }
}

/// The uids given, by tenant key (`TenantKey::to_text`).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Assigned {
    uids: BTreeMap<String, u32>,
}

impl StateDocument for Assigned {
    const FILE: &'static str = "tenant-uids.json";
    const VERSION: u32 = 1;
    const WHAT: &'static str = "tenants' uids";
}

/// The uids given to tenants that are no Unix user.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    /// Where the assignments are kept (None: in memory only).
    dir: Option<Arc<StateDir>>,
    assigned: Mutex<Assigned>,
}

impl UidPool {
    /// A pool whose assignments live in memory only (no state directory: a
    /// restart may give a tenant another uid).
    pub fn in_memory(range: UidRange) -> UidPool {
        UidPool {
            range,
            dir: None,
            assigned: Mutex::new(Assigned::default()),
        }
    }

    /// The pool with the assignments `dir` keeps (a file that cannot be used
    /// is moved aside and logged: its tenants get uids anew).
    pub fn restore(range: UidRange, dir: Arc<StateDir>) -> UidPool {
        let assigned = match dir.load::<Assigned>() {
            Loaded::Missing => Assigned::default(),
            Loaded::Restored(assigned) => assigned,
            Loaded::Dropped(dropped) => {
                tracing::warn!("the tenants' uids were not restored: {dropped}");
                Assigned::default()
            }
        };
        UidPool {
            range,
            dir: Some(dir),
            assigned: Mutex::new(assigned),
        }
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The uid `key` was given, if any (nothing is assigned).
    pub fn assigned(&self, key: &TenantKey) -> Option<u32> {
        self.lock().uids.get(&key.to_text()).copied()
    }

    /// `key`'s uid: the one it was given, or the lowest free one of the range,
    /// saved before it is returned (blocks on a fsync).
    pub fn uid_of(&self, key: &TenantKey) -> Result<u32, String> {
        self.uid_of_with(key, known_to_user_database)
    }

    /// [`Self::uid_of`], with `taken` saying which uids the system uses.
    fn uid_of_with(&self, key: &TenantKey, taken: impl Fn(u32) -> bool) -> Result<u32, String> {
        let text = key.to_text();
        let mut assigned = self.lock();
        if let Some(&uid) = assigned.uids.get(&text) {
            if self.range.contains(uid) && !taken(uid) {
                return Ok(uid);
            }
            // The range changed, or an account got the number since: a uid
            // anew, never a real user's.
            tracing::warn!(tenant = %text, uid, range = %self.range,
                "the tenant's uid is outside --tenant-uid-range or now belongs to an account: it gets another");
        }
        let used: std::collections::BTreeSet<u32> = assigned
            .uids
            .iter()
            .filter(|(k, _)| **k != text)
            .map(|(_, &uid)| uid)
            .collect();
        let uid = (self.range.first..=self.range.last)
            .find(|uid| !used.contains(uid) && !taken(*uid))
            .ok_or_else(|| {
                format!(
                    "no uid is left for tenant {text}: every uid of --tenant-uid-range {} is given to a tenant \
                     ({} of them) or used by an account; widen the range",
                    self.range,
                    used.len()
                )
            })?;
        let mut next = assigned.clone();
        next.uids.insert(text.clone(), uid);
        if let Some(dir) = &self.dir {
            dir.save(&next).map_err(|e| {
                format!("cannot keep tenant {text}'s uid {uid} in the state directory, so its executor is not started: {e}")
            })?;
        }
        *assigned = next;
        tracing::info!(tenant = %text, uid, "a uid of the tenant's own (--tenant-uid-range)");
        Ok(uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Assigned> {
        self.assigned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether the user database (or the group database: the executor's gid is
/// the same number) knows `id`.
fn known_to_user_database(id: u32) -> bool {
    crate::tenant::users::Account::by_uid(id).is_some() || group_exists(id)
}

fn group_exists(gid: u32) -> bool {
    let mut size = 1024usize;
    loop {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: zeroed group is a valid out-parameter; buf outlives the call.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc =
            unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut result) };
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        return rc == 0 && !result.is_null();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn named(name: &str) -> TenantKey {
        TenantKey::Named(name.into())
    }

    #[test]
    fn ranges_parse_and_refuse_root_and_nobody() {
        assert_eq!(
            UidRange::parse("200000-299999").unwrap(),
            UidRange {
                first: 200000,
                last: 299999
            }
        );
        assert_eq!(UidRange::default().to_string(), DEFAULT_RANGE);
        for bad in [
            "",
            "5",
            "a-b",
            "10-5",
            "0-10",
            "60000-70000",
            "1-4294967295",
        ] {
            assert!(UidRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenants_get_distinct_uids_skipping_taken_ones_and_keep_them() {
        let pool = UidPool::in_memory(UidRange::parse("100-104").unwrap());
        let taken = |uid: u32| uid == 100 || uid == 102;
        assert_eq!(pool.uid_of_with(&named("a"), taken).unwrap(), 101);
        assert_eq!(pool.uid_of_with(&named("b"), taken).unwrap(), 103);
        assert_eq!(pool.uid_of_with(&named("a"), taken).unwrap(), 101);
        assert_eq!(pool.assigned(&named("b")), Some(103));
        assert_eq!(pool.assigned(&named("c")), None);
        assert_eq!(pool.uid_of_with(&named("c"), taken).unwrap(), 104);
        let err = pool.uid_of_with(&named("d"), taken).unwrap_err();
        assert!(
            err.contains("no uid is left") && err.contains("100-104"),
            "{err}"
        );
        // An account that got a tenant's number since: the tenant moves.
        let now_taken = |uid: u32| taken(uid) || uid == 101;
        pool.lock().uids.remove("name:c");
        assert_eq!(pool.uid_of_with(&named("a"), now_taken).unwrap(), 104);
    }

    #[test]
    fn real_accounts_are_skipped() {
        assert!(known_to_user_database(0));
        assert!(!known_to_user_database(4_000_000_001));
    }

    #[test]
    fn assignments_survive_a_restart_in_a_private_file() {
        let path = crate::state_dir::temp_dir("uid-pool");
        let range = UidRange::parse("100-199").unwrap();
        {
            let dir = Arc::new(StateDir::open(&path).unwrap());
            let pool = UidPool::restore(range, dir);
            assert_eq!(pool.uid_of_with(&named("a"), |_| false).unwrap(), 100);
            assert_eq!(pool.uid_of_with(&named("b"), |_| false).unwrap(), 101);
        }
        let file = path.join("tenant-uids.json");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let dir = Arc::new(StateDir::open(&path).unwrap());
        let pool = UidPool::restore(range, dir);
        assert_eq!(pool.assigned(&named("b")), Some(101));
        assert_eq!(pool.uid_of_with(&named("b"), |_| false).unwrap(), 101);
        assert_eq!(pool.uid_of_with(&named("c"), |_| false).unwrap(), 102);
        let _ = std::fs::remove_dir_all(&path);
    }
}
