//! Who may act on the whole server through the admin API: see every job and
//! its timeline, change another tenant's job hints, change the policy. Every
//! other tenant sees and changes only its own jobs.
//!
//! Admins are the server's own user, root, and the tenants named in
//! `--admins`. Under `--auth off` there are no tenants to tell apart: the one
//! anonymous tenant is everyone, and an admin.

use crate::tenant::identity::{Tenant, TenantKey};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admins {
    /// `--admins`: tenant names (Unix user names, or token tenants' names).
    names: Vec<String>,
    server_uid: u32,
}

impl Default for Admins {
    /// No names: the server's own user and root.
    fn default() -> Admins {
        Admins::new(Vec::new())
    }
}

impl Admins {
    pub fn new(names: Vec<String>) -> Admins {
        // SAFETY: geteuid cannot fail.
        let server_uid = unsafe { libc::geteuid() };
        Admins::with_server_uid(names, server_uid)
    }

    pub fn with_server_uid(names: Vec<String>, server_uid: u32) -> Admins {
        Admins {
            names: names
                .into_iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            server_uid,
        }
    }

    pub fn allows(&self, tenant: &Tenant) -> bool {
        match tenant.key {
            TenantKey::Anonymous => true,
            TenantKey::Uid(uid) if uid == 0 || uid == self.server_uid => true,
            _ => self.names.iter().any(|n| *n == tenant.name),
        }
    }

    /// Who is an admin, for refusals.
    pub fn describe(&self) -> String {
        let server = crate::tenant::users::Account::by_uid(self.server_uid)
            .map_or_else(|| format!("uid {}", self.server_uid), |a| a.name);
        if self.names.is_empty() {
            format!("the server's own user ({server}) and root (--admins names more)")
        } else {
            format!(
                "the server's own user ({server}), root, and {} (--admins)",
                self.names.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Tenant {
        Tenant::named(name)
    }

    #[test]
    fn the_servers_user_root_and_named_tenants_are_admins() {
        let admins = Admins::with_server_uid(vec!["ci-bot".into(), " ".into()], 1500);
        assert!(admins.allows(&Tenant::from_uid(0)));
        assert!(admins.allows(&Tenant::from_uid(1500)));
        assert!(!admins.allows(&Tenant::from_uid(1501)));
        assert!(admins.allows(&named("ci-bot")));
        assert!(!admins.allows(&named("intruder")));
        assert!(admins.allows(&Tenant::anonymous()));
        let user = Tenant {
            key: TenantKey::Uid(1502),
            name: "ci-bot".into(),
            uid: Some(1502),
            user: None,
        };
        assert!(admins.allows(&user), "a user named in --admins");
        assert!(
            admins.describe().contains("ci-bot"),
            "{}",
            admins.describe()
        );
    }
}
