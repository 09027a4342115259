//! `salus token`: issued tokens as rows and JSON, and the parsing of `token issue`'s words.

use salus_proto::salus::v1::{TenantLimits, TokenInfo};
use serde_json::{json, Value};

use super::CtlError;

pub(super) fn token_json(t: &TokenInfo) -> Value {
    let l = t.limits.unwrap_or_default();
    json!({
        "id": t.id, "tenant": t.tenant, "uid": t.uid,
        "weight": l.weight, "max_jobs": l.max_jobs, "max_priority": l.max_priority,
        "memory_bytes": l.memory_bytes,
        "issued_unix_s": t.issued_unix_seconds,
        "expires_unix_s": (t.expires_unix_seconds > 0.0).then_some(t.expires_unix_seconds),
    })
}

pub(super) fn tokens_table(tokens: &[TokenInfo]) -> String {
    if tokens.is_empty() {
        return "no tokens issued\n".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut out = format!(
        "{:<14}{:<24}{:<8}{:<14}{}\n",
        "ID", "TENANT", "UID", "EXPIRES IN", "LIMITS"
    );
    for t in tokens {
        let uid = t.uid.map_or("-".to_string(), |u| u.to_string());
        let expires = if t.expires_unix_seconds > 0.0 {
            format!("{:.0} s", (t.expires_unix_seconds - now).max(0.0))
        } else {
            "never".into()
        };
        out += &format!(
            "{:<14}{:<24}{:<8}{:<14}{}\n",
            t.id,
            t.tenant,
            uid,
            expires,
            limits_text(t.limits.as_ref())
        );
    }
    out
}

/// A uid, or a user name looked up on this machine.
pub(super) fn resolve_uid(text: &str) -> Result<u32, CtlError> {
    if let Ok(uid) = text.parse() {
        return Ok(uid);
    }
    crate::users::uid_by_name(text)
        .ok_or_else(|| CtlError::Usage(format!("--uid {text:?}: no such user on this machine")))
}

/// "weight=2 max-jobs=4" (the tenants file's words), or "none".
pub(super) fn limits_text(l: Option<&TenantLimits>) -> String {
    let l = l.cloned().unwrap_or_default();
    let parts: Vec<String> = [
        l.weight.map(|w| format!("weight={w}")),
        l.max_jobs.map(|n| format!("max-jobs={n}")),
        l.max_priority.map(|p| format!("max-priority={p}")),
        l.memory_bytes
            .map(|m| format!("memory={}", crate::units::size_word(m))),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}
