//! The checkpoint directories of executors that run as a tenant's Unix user.

use std::path::PathBuf;

use crate::tenant::identity::{Tenant, TenantKey};
use crate::tenant::users::Account;

/// Where a tenant that is no Unix user keeps its jobs' checkpoint directories,
/// below the per-job base: the anonymous tenant (`--auth off`) the base
/// itself, a token tenant `tenant-NAME`.
pub fn checkpoint_subdir(tenant: &Tenant) -> PathBuf {
    match &tenant.key {
        TenantKey::Named(name) => PathBuf::from(format!(
            "tenant-{}",
            name.replace(
                |c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "_"
            )
        )),
        _ => PathBuf::new(),
    }
}

/// Creates `dir` for an executor that runs as `account` and cannot create it
/// itself (the base belongs to the server's user).
pub(super) fn prepare_checkpoint_dir(
    dir: &std::path::Path,
    account: &Account,
    groups: &[u32],
) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for ancestor in dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(ancestor) else {
            continue; // created below, by us
        };
        let mode = meta.mode();
        let searchable = (meta.uid() == account.uid && mode & 0o100 != 0)
            || (groups.contains(&meta.gid()) && mode & 0o010 != 0)
            || mode & 0o001 != 0;
        if !searchable {
            // Not fatal: the tenant may never save a checkpoint; one that does
            // gets the operating system's refusal, and the log says why.
            tracing::warn!("{}", format!(
                "the checkpoint directory {} cannot be reached by user {} (uid {}), whom this tenant's executor \
                 runs as: {} is not searchable for it (chmod o+x it, or choose another --checkpoint-root)",
                dir.display(),
                account.name,
                account.uid,
                ancestor.display()
            ));
            break;
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot create the checkpoint directory {}: {e}",
            dir.display()
        )
    })?;
    std::os::unix::fs::chown(dir, Some(account.uid), Some(account.gid))
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| {
            format!(
                "cannot give the checkpoint directory {} to {}: {e}",
                dir.display(),
                account.name
            )
        })
}
