//! Unix accounts from the system's user database (getpwnam_r / getpwuid_r /
//! getgrouplist, so NSS sources count as they do for `id`).

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// One user: what a process running as that user needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    pub home: PathBuf,
}

impl Account {
    pub fn by_uid(uid: u32) -> Option<Account> {
        lookup(|pwd, buf, len, result| unsafe { libc::getpwuid_r(uid, pwd, buf, len, result) })
    }

    pub fn by_name(name: &str) -> Option<Account> {
        let name = CString::new(name).ok()?;
        lookup(|pwd, buf, len, result| unsafe {
            libc::getpwnam_r(name.as_ptr(), pwd, buf, len, result)
        })
    }

    /// The user's groups, the primary one included (`id -G`).
    pub fn groups(&self) -> Vec<u32> {
        let Ok(name) = CString::new(self.name.as_str()) else {
            return vec![self.gid];
        };
        let mut count: libc::c_int = 64;
        loop {
            let mut groups = vec![0 as libc::gid_t; count as usize];
            let before = count;
            // SAFETY: `groups` holds `count` entries; getgrouplist writes at most that many.
            let found = unsafe {
                libc::getgrouplist(name.as_ptr(), self.gid, groups.as_mut_ptr(), &mut count)
            };
            if found >= 0 {
                groups.truncate(count.max(0) as usize);
                return groups;
            }
            if count <= before {
                count = before.saturating_mul(2);
            }
            if count > 65_536 {
                return vec![self.gid];
            }
        }
    }
}

type Lookup<'a> = dyn FnMut(*mut libc::passwd, *mut libc::c_char, libc::size_t, *mut *mut libc::passwd) -> libc::c_int
    + 'a;

#[cfg(test)]
thread_local! {
    /// User-database lookups made on this thread: tests prove a path makes none.
    pub static LOOKUPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn lookup(
    mut call: impl FnMut(
        *mut libc::passwd,
        *mut libc::c_char,
        libc::size_t,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> Option<Account> {
    #[cfg(test)]
    LOOKUPS.with(|n| n.set(n.get() + 1));
    let call: &mut Lookup = &mut call;
    let mut size = 1024usize;
    loop {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: zeroed passwd is a valid out-parameter; the strings it points
        // to live in `buf`, which outlives their use below.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        // SAFETY: on success the fields point to NUL-terminated strings in `buf`.
        let text = |p: *const libc::c_char| unsafe {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        return Some(Account {
            name: text(pwd.pw_name),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            home: PathBuf::from(text(pwd.pw_dir)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_both_ways() {
        let root = Account::by_uid(0).expect("uid 0 exists");
        assert_eq!(root.name, "root");
        assert_eq!(root.gid, 0);
        assert_eq!(Account::by_name("root"), Some(root.clone()));
        assert!(root.groups().contains(&0));
    }

    #[test]
    fn unknown_users_are_none() {
        assert_eq!(Account::by_uid(4_000_000_001), None);
        assert_eq!(Account::by_name("no-such-user-salus"), None);
        assert_eq!(Account::by_name("nul\0inside"), None);
    }
}
