//! Who a request comes from: a loopback client's Unix user (found once per
//! connection, [`super::peer_uid`]), or a token the client carries in its
//! `user-agent` (`salus1.TOKEN`, set through `TF_GRPC_DEFAULT_OPTIONS` by the
//! adapter and the C shim from `SALUS_TOKEN`) and the operator's tenants file
//! maps to a tenant. `--auth` chooses which of the two are accepted.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::tenant::limits::{Limits, LimitsTable, LIMIT_NAMES};
use crate::tenant::tokens::{find_by_hash, IssuedToken, TokenStore};
use std::time::SystemTime;

/// The prefix of a token in the `user-agent` header.
pub const TOKEN_PREFIX: &str = "salus1.";

/// What `--auth` accepts as a tenant's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Every request is one anonymous tenant (the server's behaviour before tenants).
    Off,
    /// A loopback client's Unix user; tokens are ignored.
    Uid,
    /// A token from the tenants file; the peer's user is not consulted.
    Token,
    /// A token when the client carries one, else the loopback client's user.
    Both,
}

impl AuthMode {
    pub const NAMES: [&'static str; 4] = ["uid", "token", "both", "off"];

    pub fn parse(name: &str) -> Option<AuthMode> {
        match name {
            "off" => Some(AuthMode::Off),
            "uid" => Some(AuthMode::Uid),
            "token" => Some(AuthMode::Token),
            "both" => Some(AuthMode::Both),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AuthMode::Off => "off",
            AuthMode::Uid => "uid",
            AuthMode::Token => "token",
            AuthMode::Both => "both",
        }
    }

    fn accepts_uid(self) -> bool {
        matches!(self, AuthMode::Uid | AuthMode::Both)
    }

    fn accepts_token(self) -> bool {
        matches!(self, AuthMode::Token | AuthMode::Both)
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tenant. Two requests belong to the same tenant exactly when their
/// [`TenantKey`]s are equal; jobs are owned by a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub key: TenantKey,
    /// For logs and the admin API: the user's name, or the tenants file's name.
    pub name: String,
    /// The Unix user the tenant's computation may run as, when it is one.
    pub uid: Option<u32>,
    /// That user's name, looked up once when the tenant was built (None: no
    /// user, or the user database does not know the uid): the limits table is
    /// matched by it under the scheduler's lock, where a name-service lookup
    /// (sssd, LDAP: a network round trip) must not run.
    pub user: Option<String>,
}

/// What makes tenants distinct: a Unix user is one tenant however it is
/// identified (its loopback connections and a token bound to it); a token
/// without a user is a tenant of its own; `Anonymous` is everyone under `--auth off`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TenantKey {
    Anonymous,
    Uid(u32),
    Named(String),
}

impl TenantKey {
    /// `uid:N`, `name:NAME` or `anonymous`: the key as an executor's
    /// environment and its record in the state directory spell it.
    pub fn to_text(&self) -> String {
        match self {
            TenantKey::Anonymous => "anonymous".to_string(),
            TenantKey::Uid(uid) => format!("uid:{uid}"),
            TenantKey::Named(name) => format!("name:{name}"),
        }
    }

    /// The key [`TenantKey::to_text`] spelled (anything else: anonymous).
    pub fn from_text(text: &str) -> Result<TenantKey, String> {
        if let Some(uid) = text.strip_prefix("uid:") {
            let uid = uid
                .parse()
                .map_err(|_| format!("bad tenant key {text:?}"))?;
            Ok(TenantKey::Uid(uid))
        } else if let Some(name) = text.strip_prefix("name:") {
            Ok(TenantKey::Named(name.to_string()))
        } else {
            Ok(TenantKey::Anonymous)
        }
    }

    /// The Unix user a uid key names.
    pub fn uid(&self) -> Option<u32> {
        match self {
            TenantKey::Uid(uid) => Some(*uid),
            _ => None,
        }
    }
}

impl TenantKey {
    /// How the admin API shows the key, and takes it back
    /// ([`keys_named`]): `user:NAME` (`uid:N` for a uid the user database
    /// does not know), `token:NAME` for a tenant that is no user, `anonymous`.
    /// Looks the user up.
    pub fn spec(&self) -> String {
        match self {
            TenantKey::Anonymous => "anonymous".into(),
            TenantKey::Uid(uid) => match user_name(*uid) {
                Some(name) => format!("user:{name}"),
                None => format!("uid:{uid}"),
            },
            TenantKey::Named(name) => format!("token:{name}"),
        }
    }

    /// The key text ([`TenantKey::to_text`]) of a tenant that state written
    /// before tenants were kept by key (the job history and job hints of
    /// earlier releases) names by its display name: the Unix user of that
    /// name when the user database knows one (`uid N`: that uid), else the
    /// token tenant of that name. A user is preferred because it is the
    /// one a token tenant could have been named after (the confusion this
    /// keying ends), never the other way round. Key texts, `anonymous` and ""
    /// stay as they are.
    pub fn text_from_legacy(name: &str) -> String {
        if name.is_empty() || name == "anonymous" || name.contains(':') {
            return name.to_string();
        }
        if let Some(uid) = name
            .strip_prefix("uid ")
            .and_then(|u| u.parse::<u32>().ok())
        {
            return TenantKey::Uid(uid).to_text();
        }
        match crate::tenant::users::Account::by_name(name) {
            Some(account) => TenantKey::Uid(account.uid).to_text(),
            None => TenantKey::Named(name.to_string()).to_text(),
        }
    }
}

/// The tenants a word of the admin API (`salus history --tenant WORD`) may
/// name: `user:NAME` or `uid:N` a Unix user, `token:NAME` (or `name:NAME`) a
/// tenant that is no user, `anonymous` everyone under `--auth off`; a bare
/// NAME both the user and the token tenant of that name (the caller decides
/// what an ambiguity means).
pub fn keys_named(word: &str) -> Result<Vec<TenantKey>, String> {
    if let Some(name) = word.strip_prefix("user:") {
        return crate::tenant::users::Account::by_name(name)
            .map(|a| vec![TenantKey::Uid(a.uid)])
            .ok_or_else(|| format!("no user {name:?} on this machine"));
    }
    if let Some(uid) = word.strip_prefix("uid:") {
        return uid
            .parse()
            .map(|uid| vec![TenantKey::Uid(uid)])
            .map_err(|_| format!("{word:?}: a uid is a number"));
    }
    if let Some(name) = word
        .strip_prefix("token:")
        .or_else(|| word.strip_prefix("name:"))
    {
        return Ok(vec![TenantKey::Named(name.to_string())]);
    }
    if word.is_empty() {
        return Err("an empty tenant name".into());
    }
    let mut keys = Vec::new();
    if word == "anonymous" {
        keys.push(TenantKey::Anonymous);
    }
    if let Some(account) = crate::tenant::users::Account::by_name(word) {
        keys.push(TenantKey::Uid(account.uid));
    }
    keys.push(TenantKey::Named(word.to_string()));
    Ok(keys)
}

impl Tenant {
    /// The tenant of `key`, named `name` (its user looked up now).
    pub fn of_key(key: TenantKey, name: String) -> Tenant {
        let uid = key.uid();
        Tenant {
            key,
            name,
            uid,
            user: uid.and_then(user_name),
        }
    }

    pub fn anonymous() -> Tenant {
        Tenant {
            key: TenantKey::Anonymous,
            name: "anonymous".into(),
            uid: None,
            user: None,
        }
    }

    /// A tenant that is no Unix user (a token tenant without one).
    pub fn named(name: &str) -> Tenant {
        Tenant {
            key: TenantKey::Named(name.to_string()),
            name: name.to_string(),
            uid: None,
            user: None,
        }
    }

    /// Looks the user's name up (once: the tenant keeps it).
    pub fn from_uid(uid: u32) -> Tenant {
        let user = user_name(uid);
        Tenant {
            key: TenantKey::Uid(uid),
            name: user.clone().unwrap_or_else(|| format!("uid {uid}")),
            uid: Some(uid),
            user,
        }
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.uid {
            Some(uid) if self.name != format!("uid {uid}") => {
                write!(f, "{} (uid {uid})", self.name)
            }
            _ => f.write_str(&self.name),
        }
    }
}

/// Why a request has no tenant; the message tells the client what to set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error(
        "this server (--auth {mode}) identifies tenants by a token, and the request carries none: \
         set SALUS_TOKEN in the client's environment to a token the server's tenants file lists \
         (the Salus adapter and C shim send it; or set TF_GRPC_DEFAULT_OPTIONS='grpc.primary_user_agent=\"salus1.TOKEN\"' \
         before TensorFlow starts)"
    )]
    NoToken { mode: AuthMode },
    #[error(
        "the token in the request's user-agent is neither in the server's tenants file nor issued \
         and still valid (revoked tokens are forgotten): check SALUS_TOKEN"
    )]
    UnknownToken,
    #[error(
        "the request's token (tenant {tenant}) expired {ago_s} s ago: ask for a new one \
         (salus token issue)"
    )]
    ExpiredToken { tenant: String, ago_s: u64 },
    #[error(
        "the request's token belongs to tenant {tenant}, bound to uid {bound}, but it comes from a \
         process of uid {peer} on this machine: a token is only valid from its own user"
    )]
    TokenOfAnotherUser {
        tenant: String,
        bound: u32,
        peer: u32,
    },
    #[error(
        "this server (--auth {mode}) could not tell which Unix user the connection belongs to \
         ({why}): connect over loopback (127.0.0.1 or ::1) from this machine, or set SALUS_TOKEN to a \
         token the server's tenants file lists"
    )]
    NoPeerUser { mode: AuthMode, why: String },
    #[error(
        "this server (--auth uid) identifies tenants by their Unix user only and could not find it \
         ({why}): connect over loopback (127.0.0.1 or ::1) from this machine"
    )]
    UidOnly { why: String },
}

/// A tenants file entry with a token.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TokenEntry {
    name: String,
    token_sha256: [u8; 32],
    uid: Option<u32>,
}

/// The operator's tenants file: one tenant a line,
/// `NAME SHA256-OF-TOKEN RUN-AS [LIMIT=VALUE ...]`, where RUN-AS is a user
/// name, a uid, or `-` for none, and the limits are [`Limits`] fields. A line
/// whose hash is `-` gives a tenant no token, only limits (a Unix user
/// identified by its uid: NAME is the user's name); `* - - LIMITS` sets the
/// defaults. `#` starts a comment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantsFile {
    entries: Vec<TokenEntry>,
    limits: LimitsTable,
}

impl TenantsFile {
    pub fn load(path: &Path) -> Result<TenantsFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tenants file {}: {e}", path.display()))?;
        TenantsFile::parse(&text).map_err(|e| format!("tenants file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<TenantsFile, String> {
        let mut entries: Vec<TokenEntry> = Vec::new();
        let mut limits_table = LimitsTable::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |msg: String| format!("line {}: {msg}", number + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, hash, run_as, ref limit_fields @ ..] = fields[..] else {
                return Err(at(format!(
                    "expected three fields, NAME SHA256-OF-TOKEN RUN-AS (a user, a uid or -), \
                     then limits ({LIMIT_NAMES}); found {}",
                    fields.len()
                )));
            };
            let limits = Limits::parse(limit_fields.iter().copied()).map_err(at)?;
            if hash == "-" {
                if name != "*" && run_as != "-" && resolve_user(run_as).is_none() {
                    return Err(at(format!("no Unix user {run_as:?} on this machine")));
                }
                if name == "*" && run_as != "-" {
                    return Err(at("the defaults line is `* - - LIMITS`".into()));
                }
                limits_table.set(name, &limits);
                continue;
            }
            if name == "*" {
                return Err(at(
                    "`*` names the defaults and has no token: `* - - LIMITS`".into(),
                ));
            }
            let token_sha256 = parse_sha256(hash).ok_or_else(|| {
                at(
                    "the second field must be the token's SHA-256 as 64 hex digits \
                    (printf %s TOKEN | sha256sum)"
                        .into(),
                )
            })?;
            let uid = match run_as {
                "-" => None,
                user => Some(resolve_user(user).ok_or_else(|| {
                    at(format!("no Unix user {user:?} on this machine (use - for a tenant that is no user)"))
                })?),
            };
            if entries.iter().any(|e| e.name == name) {
                return Err(at(format!("tenant {name:?} is listed twice")));
            }
            if entries.iter().any(|e| e.token_sha256 == token_sha256) {
                return Err(at(format!(
                    "tenant {name:?} has the same token as an earlier tenant"
                )));
            }
            entries.push(TokenEntry {
                name: name.to_string(),
                token_sha256,
                uid,
            });
            if limits != Limits::default() {
                limits_table.set(name, &limits);
            }
        }
        Ok(TenantsFile {
            entries,
            limits: limits_table,
        })
    }

    /// The limits the file sets.
    pub fn limits(&self) -> &LimitsTable {
        &self.limits
    }

    /// Tenants with a token.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&self, token: &str) -> Option<&TokenEntry> {
        find_by_hash(&self.entries, |e| &e.token_sha256, token)
    }
}

/// What the server knows about a connection when it is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerUser {
    /// A loopback client's Unix user.
    Uid(u32),
    /// Not found, and why (not loopback, closed meanwhile, another network namespace...).
    Unknown(String),
}

/// Resolves requests to tenants under one `--auth` mode.
#[derive(Debug)]
pub struct Identifier {
    mode: AuthMode,
    /// Replaced whole when the file is read again (`salus reload`, SIGHUP).
    tenants: std::sync::RwLock<Arc<TenantsFile>>,
    issued: TokenStore,
    anonymous: Arc<Tenant>,
    by_uid: std::sync::Mutex<HashMap<u32, Arc<Tenant>>>,
}

impl Identifier {
    pub fn new(mode: AuthMode, tenants: TenantsFile) -> Identifier {
        Identifier {
            mode,
            tenants: std::sync::RwLock::new(Arc::new(tenants)),
            issued: TokenStore::default(),
            anonymous: Arc::new(Tenant::anonymous()),
            by_uid: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Takes `issued` as its store of tokens issued at run time (one restored
    /// from the state directory).
    pub fn with_issued(mut self, issued: TokenStore) -> Identifier {
        self.issued = issued;
        self
    }

    /// The tenants file as last read.
    pub fn tenants(&self) -> Arc<TenantsFile> {
        self.tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes `tenants` (the file read again) for the connections accepted
    /// from now on; connections open stay as they were identified.
    pub fn replace_tenants(&self, tenants: TenantsFile) {
        *self.tenants.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tenants);
    }

    /// Tokens issued at run time.
    pub fn issued(&self) -> &TokenStore {
        &self.issued
    }

    /// The uid a token for tenant `name` is bound to: `asked`, or the tenants
    /// file's binding of that name; an error if they differ.
    pub fn binding_for(&self, name: &str, asked: Option<u32>) -> Result<Option<u32>, String> {
        let tenants = self.tenants();
        let listed = tenants.entries.iter().find(|e| e.name == name);
        match (listed.map(|e| e.uid), asked) {
            (Some(Some(bound)), Some(uid)) if bound != uid => Err(format!(
                "tenant {name} is bound to uid {bound} in the tenants file, not {uid}"
            )),
            (Some(bound), None) => Ok(bound),
            (_, asked) => Ok(asked),
        }
    }

    /// Whether the tenant of `gone` (a token just revoked or expired) can still
    /// be identified: as its Unix user (under an `--auth` that accepts uids),
    /// by a tenants file token, or by another valid issued token.
    pub fn still_admits(&self, gone: &IssuedToken, now: SystemTime) -> bool {
        if gone.uid.is_some() && self.mode.accepts_uid() {
            return true;
        }
        let listed = self.tenants().entries.iter().any(|e| match gone.uid {
            Some(uid) => e.uid == Some(uid),
            None => e.uid.is_none() && e.name == gone.tenant,
        });
        // Some (if only default limits) while a valid token of the tenant remains.
        listed || self.issued.limits_of(gone, now).is_some()
    }

    /// Every request is `tenant`'s: an executor process serves one tenant,
    /// whom the supervisor identified.
    pub fn fixed(tenant: Arc<Tenant>) -> Identifier {
        Identifier {
            mode: AuthMode::Off,
            tenants: Default::default(),
            issued: TokenStore::default(),
            anonymous: tenant,
            by_uid: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Whether identifying needs the peer's user (a sock_diag lookup per connection).
    pub fn wants_peer_user(&self) -> bool {
        // Tokens bound to users (in the tenants file, or issued at run time)
        // need the peer's user to refuse a token presented by another user.
        self.mode.accepts_uid() || self.mode.accepts_token()
    }

    /// The tenant of a request from `peer` whose `user-agent` header is `user_agent`.
    pub fn identify(
        &self,
        peer: &PeerUser,
        user_agent: Option<&str>,
    ) -> Result<Arc<Tenant>, IdentityError> {
        if self.mode == AuthMode::Off {
            return Ok(self.anonymous.clone());
        }
        let token = user_agent.and_then(token_in_user_agent);
        if self.mode.accepts_token() {
            if let Some(token) = token {
                let listed = self
                    .tenants()
                    .find(token)
                    .map(|entry| (entry.name.clone(), entry.uid));
                let (name, uid) = match listed {
                    Some(found) => found,
                    None => match self.issued.find(token, SystemTime::now()) {
                        Ok(Some(issued)) => (issued.tenant, issued.uid),
                        Ok(None) => return Err(IdentityError::UnknownToken),
                        Err(expired) => {
                            return Err(IdentityError::ExpiredToken {
                                tenant: expired.tenant,
                                ago_s: SystemTime::now()
                                    .duration_since(expired.at)
                                    .map_or(0, |d| d.as_secs()),
                            })
                        }
                    },
                };
                if let (Some(bound), PeerUser::Uid(peer)) = (uid, peer) {
                    if bound != *peer {
                        return Err(IdentityError::TokenOfAnotherUser {
                            tenant: name,
                            bound,
                            peer: *peer,
                        });
                    }
                }
                return Ok(match uid {
                    Some(uid) => self.tenant_of_uid(uid),
                    None => Arc::new(Tenant::named(&name)),
                });
            }
        }
        match (self.mode, peer) {
            (AuthMode::Token, _) => Err(IdentityError::NoToken { mode: self.mode }),
            (_, PeerUser::Uid(uid)) => Ok(self.tenant_of_uid(*uid)),
            (AuthMode::Uid, PeerUser::Unknown(why)) => {
                Err(IdentityError::UidOnly { why: why.clone() })
            }
            (mode, PeerUser::Unknown(why)) => Err(IdentityError::NoPeerUser {
                mode,
                why: why.clone(),
            }),
        }
    }

    fn tenant_of_uid(&self, uid: u32) -> Arc<Tenant> {
        let mut known = self.by_uid.lock().unwrap_or_else(|e| e.into_inner());
        known
            .entry(uid)
            .or_insert_with(|| Arc::new(Tenant::from_uid(uid)))
            .clone()
    }
}

/// The token in a `user-agent` header, a word of its own wherever it stands:
/// TensorFlow's gRPC puts it after its own name (`grpc-c++/1.74.0 salus1.TOKEN
/// grpc-c/49.0.0 (linux; chttp2)`, measured with 2.21 and 2.16), grpcio first.
pub fn token_in_user_agent(user_agent: &str) -> Option<&str> {
    user_agent
        .split_ascii_whitespace()
        .find_map(|part| part.strip_prefix(TOKEN_PREFIX))
        .filter(|token| !token.is_empty())
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A user name or a numeric uid.
fn resolve_user(user: &str) -> Option<u32> {
    if let Ok(uid) = user.parse::<u32>() {
        return Some(uid);
    }
    crate::tenant::users::Account::by_name(user).map(|a| a.uid)
}

pub fn user_name(uid: u32) -> Option<String> {
    crate::tenant::users::Account::by_uid(uid).map(|a| a.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn keys_are_spelled_for_people_and_read_back() {
        assert_eq!(TenantKey::Uid(0).spec(), "user:root");
        assert_eq!(TenantKey::Uid(4_000_000_001).spec(), "uid:4000000001");
        assert_eq!(TenantKey::Named("ci".into()).spec(), "token:ci");
        assert_eq!(TenantKey::Anonymous.spec(), "anonymous");
        for key in [
            TenantKey::Uid(0),
            TenantKey::Uid(4_000_000_001),
            TenantKey::Named("ci".into()),
        ] {
            assert_eq!(keys_named(&key.spec()).unwrap(), std::slice::from_ref(&key));
            assert!(keys_named(&key.to_text()).unwrap().contains(&key));
        }
        // A bare name is both the user and the token tenant of that name.
        assert_eq!(
            keys_named("root").unwrap(),
            [TenantKey::Uid(0), TenantKey::Named("root".into())]
        );
        assert_eq!(keys_named("ci").unwrap(), [TenantKey::Named("ci".into())]);
        assert_eq!(
            keys_named("anonymous").unwrap(),
            [TenantKey::Anonymous, TenantKey::Named("anonymous".into())]
        );
        assert!(keys_named("user:no-such-user-salus").is_err());
        assert!(keys_named("uid:x").is_err());
        assert!(keys_named("").is_err());
    }

    #[test]
    fn legacy_names_become_the_user_of_that_name_else_a_token_tenant() {
        assert_eq!(TenantKey::text_from_legacy("root"), "uid:0");
        assert_eq!(TenantKey::text_from_legacy("uid 1234"), "uid:1234");
        assert_eq!(TenantKey::text_from_legacy("ci-bot"), "name:ci-bot");
        assert_eq!(TenantKey::text_from_legacy("anonymous"), "anonymous");
        assert_eq!(TenantKey::text_from_legacy(""), "");
        assert_eq!(TenantKey::text_from_legacy("name:root"), "name:root");
        assert_eq!(TenantKey::text_from_legacy("uid:5"), "uid:5");
    }

    fn sha(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn file() -> TenantsFile {
        TenantsFile::parse(&format!(
            "# name hash run-as\nalice {} 1001\n\nbot {} -  # a robot\nroot-ish {} root\n",
            sha("alice-token"),
            sha("bot-token"),
            sha("root-token")
        ))
        .unwrap()
    }

    #[test]
    fn tenants_file_lines() {
        let file = file();
        assert_eq!(file.len(), 3);
        assert_eq!(file.find("alice-token").unwrap().uid, Some(1001));
        assert_eq!(file.find("bot-token").unwrap().uid, None);
        assert_eq!(file.find("root-token").unwrap().uid, Some(0));
        assert!(file.find("alice-token ").is_none());
        assert!(file.find("").is_none());
    }

    #[test]
    fn tenants_file_errors_name_the_line() {
        let err = TenantsFile::parse("alice abc 1001").unwrap_err();
        assert!(err.contains("line 1") && err.contains("SHA-256"), "{err}");
        let err = TenantsFile::parse(&format!(
            "a {} 1\nb {} no-such-user-here",
            sha("x"),
            sha("y")
        ))
        .unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("no-such-user-here"),
            "{err}"
        );
        let err = TenantsFile::parse(&format!("a {} 1\na {} 2", sha("x"), sha("y"))).unwrap_err();
        assert!(err.contains("twice"), "{err}");
        let err = TenantsFile::parse(&format!("a {} 1\nb {} 2", sha("x"), sha("x"))).unwrap_err();
        assert!(err.contains("same token"), "{err}");
        let err = TenantsFile::parse("a b").unwrap_err();
        assert!(err.contains("three fields"), "{err}");
        let err = TenantsFile::parse(&format!("a {} 1 weight=0", sha("x"))).unwrap_err();
        assert!(err.contains("line 1") && err.contains("1 to 1000"), "{err}");
        let err = TenantsFile::parse("* - root max-jobs=1").unwrap_err();
        assert!(err.contains("* - - LIMITS"), "{err}");
        let err = TenantsFile::parse("x - no-such-user-here max-jobs=1").unwrap_err();
        assert!(err.contains("no-such-user-here"), "{err}");
    }

    #[test]
    fn tenants_file_limits() {
        let file = TenantsFile::parse(&format!(
            "* - - max-jobs=8 max-priority=1\nroot - root weight=4\nbot {} - max-priority=3\n",
            sha("bot-token")
        ))
        .unwrap();
        assert_eq!(file.len(), 1, "only bot has a token");
        let limits = file.limits();
        let root = Tenant::from_uid(0);
        let root_limits = limits.for_tenant(&root.name, root.user.as_deref());
        assert_eq!(root_limits.weight, Some(4));
        assert_eq!(root_limits.max_jobs, Some(8));
        assert_eq!(limits.defaults().max_priority, Some(1));
        let bot = Tenant::named("bot");
        assert_eq!(
            limits
                .for_tenant(&bot.name, bot.user.as_deref())
                .max_priority,
            Some(3)
        );
    }

    #[test]
    fn token_is_found_in_grpc_user_agents() {
        assert_eq!(
            token_in_user_agent("grpc-c++/1.74.0 salus1.abc grpc-c/49.0.0 (linux; chttp2)"),
            Some("abc")
        );
        assert_eq!(
            token_in_user_agent("salus1.t0k grpc-python/1.85.3"),
            Some("t0k")
        );
        assert_eq!(token_in_user_agent("grpc-c++/1.62.2 (linux; chttp2)"), None);
        assert_eq!(token_in_user_agent("salus1. grpc-c++"), None);
        assert_eq!(token_in_user_agent(""), None);
    }

    #[test]
    fn modes() {
        let ua = |t: &str| format!("salus1.{t} grpc-c++/1.62.2");
        let root = PeerUser::Uid(0);
        let alice = PeerUser::Uid(1001);
        let remote = PeerUser::Unknown("not a loopback connection".into());

        let off = Identifier::new(AuthMode::Off, file());
        assert_eq!(
            off.identify(&remote, None).unwrap().key,
            TenantKey::Anonymous
        );
        assert_eq!(
            off.identify(&alice, Some(&ua("bot-token"))).unwrap().key,
            TenantKey::Anonymous
        );

        let uid = Identifier::new(AuthMode::Uid, file());
        assert_eq!(
            uid.identify(&alice, None).unwrap().key,
            TenantKey::Uid(1001)
        );
        // Tokens are not consulted: the user decides.
        assert_eq!(
            uid.identify(&alice, Some(&ua("bot-token"))).unwrap().key,
            TenantKey::Uid(1001)
        );
        assert!(matches!(
            uid.identify(&remote, Some(&ua("bot-token"))),
            Err(IdentityError::UidOnly { .. })
        ));

        let token = Identifier::new(AuthMode::Token, file());
        assert_eq!(
            token.identify(&remote, Some(&ua("bot-token"))).unwrap().key,
            TenantKey::Named("bot".into())
        );
        assert_eq!(
            token
                .identify(&remote, Some(&ua("alice-token")))
                .unwrap()
                .key,
            TenantKey::Uid(1001)
        );
        assert!(matches!(
            token.identify(&alice, None),
            Err(IdentityError::NoToken { .. })
        ));
        assert_eq!(
            token.identify(&alice, Some(&ua("wrong"))),
            Err(IdentityError::UnknownToken)
        );
        // A loopback client presenting a token bound to another user.
        assert_eq!(
            token.identify(&root, Some(&ua("alice-token"))),
            Err(IdentityError::TokenOfAnotherUser {
                tenant: "alice".into(),
                bound: 1001,
                peer: 0
            })
        );

        let both = Identifier::new(AuthMode::Both, file());
        assert_eq!(both.identify(&root, None).unwrap().key, TenantKey::Uid(0));
        assert_eq!(
            both.identify(&alice, Some(&ua("alice-token"))).unwrap().key,
            TenantKey::Uid(1001)
        );
        assert_eq!(
            both.identify(&root, Some(&ua("bot-token"))).unwrap().key,
            TenantKey::Named("bot".into())
        );
        assert!(matches!(
            both.identify(&remote, None),
            Err(IdentityError::NoPeerUser { .. })
        ));
        assert_eq!(
            both.identify(&alice, Some(&ua("wrong"))),
            Err(IdentityError::UnknownToken)
        );
        // One Arc per user: cheap to compare and to hold per job.
        let a = both.identify(&alice, None).unwrap();
        let b = both.identify(&alice, None).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn root_tenant_is_named() {
        let root = Tenant::from_uid(0);
        assert_eq!(root.name, "root");
        assert_eq!(root.to_string(), "root (uid 0)");
        let unknown = Tenant::from_uid(4_000_000_000);
        assert_eq!(unknown.to_string(), "uid 4000000000");
    }
}
