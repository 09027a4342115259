//! The tenant token: `SALUS_TOKEN`, carried in every gRPC call's user-agent header as the
//! word `salus1.<token>`, exactly as the Python adapter does it (python/src/salus/_token.py; both pass the
//! vectors of `token_vectors.txt`).
//!
//! TensorFlow gives a C-API program one way to set a channel's user agent:
//! `TF_GRPC_DEFAULT_OPTIONS`, read once, when TensorFlow creates its first gRPC channel
//! (tensorflow/core/distributed_runtime/rpc/grpc_channel.cc): comma-separated `key=value`
//! entries, a quoted value ("...", C-unescaped) a string channel argument, an unquoted integer
//! an int argument. When the library is loaded (`lib.rs`, a `.init_array` constructor, before
//! `main` and before any other thread of a preloaded program), [`apply_env`] adds
//!
//! - `grpc.primary_user_agent="salus1.<token>"`: every call of every service (MasterService,
//!   EagerService, WorkerService) carries it in its user agent, after gRPC's own name
//!   (TensorFlow 2.21, gRPC 1.74: `grpc-c++/1.74.0 salus1.<token> grpc-c/49.0.0 (linux; chttp2)`);
//! - `grpc.enable_http_proxy=0`: an `http_proxy` setting does not route the connection (and
//!   the token) through a proxy;
//!
//! to the value the user set. An invalid token: one line on stderr, the variable unchanged (the
//! server then answers UNAUTHENTICATED, saying what to set). The token is never printed and never
//! put in the session config.

use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

pub const ENV_TOKEN: &str = "SALUS_TOKEN";
pub const ENV_TF_OPTIONS: &str = "TF_GRPC_DEFAULT_OPTIONS";
pub const USER_AGENT_KEY: &str = "grpc.primary_user_agent";
pub const PROXY_KEY: &str = "grpc.enable_http_proxy";
pub const PROXY_ENTRY: &str = "grpc.enable_http_proxy=0";
pub const USER_AGENT_PREFIX: &str = "salus1.";
pub const MAX_LEN: usize = 256;
/// `,` and `=` separate entries and keys; `"` ends the quoted value; TensorFlow C-unescapes
/// the value, so `\` would change it.
const FORBIDDEN: &str = ",=\"\\";
const RULE: &str =
    "a token is 1 to 256 printable ASCII characters, without spaces or any of , = \" \\";

/// A token that cannot be carried; the message names the problem, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenError(pub String);

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TokenError {}

/// Why `token` cannot be sent (a phrase without the token in it), or `None` when it can.
/// Characters are counted and checked as the Python adapter does (code points, in order).
pub fn token_problem(token: &str) -> Option<String> {
    if token.is_empty() {
        return Some("is empty".to_string());
    }
    if token.chars().count() > MAX_LEN {
        return Some(format!("is longer than {MAX_LEN} characters"));
    }
    for c in token.chars() {
        if matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '\x0b') {
            return Some("contains whitespace".to_string());
        }
        if c.is_ascii_control() {
            return Some("contains a control character".to_string());
        }
        if !c.is_ascii() {
            return Some("contains a non-ASCII character".to_string());
        }
        if FORBIDDEN.contains(c) {
            return Some(format!("contains '{c}'"));
        }
    }
    None
}

pub fn check_token(token: &str) -> Result<&str, TokenError> {
    match token_problem(token) {
        Some(problem) => Err(TokenError(format!("{ENV_TOKEN} {problem} ({RULE})"))),
        None => Ok(token),
    }
}

pub fn user_agent_entry(token: &str) -> Result<String, TokenError> {
    Ok(format!(
        "{USER_AGENT_KEY}=\"{USER_AGENT_PREFIX}{}\"",
        check_token(token)?
    ))
}

/// `TF_GRPC_DEFAULT_OPTIONS` with the token's entries added to `existing` (`None`: unset).
///
/// The user's entries are kept as they are, in order, and ours come last; merging twice changes
/// nothing (a child process inherits the merged value). Keys are compared as TensorFlow splits
/// them, without trimming.
/// - an entry equal to ours is kept where it is, not repeated;
/// - any other `grpc.primary_user_agent` entry (the user's own agent, or a parent's other
///   token) is removed: TensorFlow passes duplicate keys on to gRPC, which joins them all into
///   the header (measured with gRPC 1.27 in TensorFlow 2.16 and 1.74 in 2.21:
///   `grpc-c++/1.74.0 mine/1 salus1.abc grpc-c/...`), so another token, or an agent of the
///   user's that looks like one, would reach the server next to ours; removed, the server has
///   exactly one token to read;
/// - a `grpc.enable_http_proxy` the user set (to anything) is their choice and kept; ours is
///   added otherwise;
/// - empty (or whitespace-only) entries, which TensorFlow refuses with an error line each, are
///   dropped.
///
/// Bytes, not `str`: the environment need not be UTF-8, and the user's entries pass unchanged.
pub fn merge_options_bytes(existing: Option<&[u8]>, token: &str) -> Result<Vec<u8>, TokenError> {
    let ours = user_agent_entry(token)?;
    let ours = ours.as_bytes();
    let mut kept: Vec<&[u8]> = Vec::new();
    let (mut have_agent, mut have_proxy) = (false, false);
    for entry in existing.unwrap_or_default().split(|&b| b == b',') {
        if entry.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let key = entry.split(|&b| b == b'=').next().unwrap_or_default();
        if key == USER_AGENT_KEY.as_bytes() {
            if entry == ours && !have_agent {
                kept.push(entry);
                have_agent = true;
            }
            continue;
        }
        if key == PROXY_KEY.as_bytes() {
            have_proxy = true;
        }
        kept.push(entry);
    }
    if !have_agent {
        kept.push(ours);
    }
    if !have_proxy {
        kept.push(PROXY_ENTRY.as_bytes());
    }
    Ok(kept.join(&b','))
}

/// [`merge_options_bytes`] on `str`s (the tests' vectors).
#[cfg(test)]
pub fn merge_options(existing: Option<&str>, token: &str) -> Result<String, TokenError> {
    let merged = merge_options_bytes(existing.map(str::as_bytes), token)?;
    // Only whole entries of `existing` (a str) and ASCII were joined with ASCII commas.
    Ok(String::from_utf8(merged).expect("entries of a str joined by ','"))
}

/// What [`apply_env`] does, on given values: `Ok(Some(new value))` to set, `Ok(None)` to leave
/// the variable as it is, `Err` for the line to print.
pub fn plan(
    token: Option<&OsStr>,
    existing: Option<&OsStr>,
) -> Result<Option<Vec<u8>>, TokenError> {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Ok(None); // unset or empty, as for the other SALUS_* variables
    };
    // Not UTF-8: refused as non-ASCII, as the Python adapter (surrogate escapes) refuses it.
    let token = token.to_string_lossy();
    let merged = merge_options_bytes(existing.map(OsStr::as_bytes), &token)?;
    Ok((existing.map(OsStr::as_bytes) != Some(&merged[..])).then_some(merged))
}

/// With `SALUS_TOKEN` set: merges the token's entries into `TF_GRPC_DEFAULT_OPTIONS`. Run once,
/// when the library is loaded (setenv is only safe before other threads run).
pub fn apply_env() {
    let token = std::env::var_os(ENV_TOKEN);
    let existing = std::env::var_os(ENV_TF_OPTIONS);
    match plan(token.as_deref(), existing.as_deref()) {
        Ok(Some(merged)) => std::env::set_var(ENV_TF_OPTIONS, OsStr::from_bytes(&merged)),
        Ok(None) => {}
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "salus: {e}; not sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// token_vectors.txt, shared with the Python adapter's tests.
    const VECTORS: &str = include_str!("token_vectors.txt");

    /// `\\`, `\xHH` and `\u{H...}` as in the vectors file.
    fn unescape(field: &str) -> String {
        let mut out = String::new();
        let mut chars = field.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('x') => {
                    let hex: String = chars.by_ref().take(2).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                Some('u') => {
                    assert_eq!(chars.next(), Some('{'), "{field}");
                    let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                other => panic!("bad escape {other:?} in {field:?}"),
            }
        }
        out
    }

    fn vectors(kind: &str) -> Vec<Vec<String>> {
        let found: Vec<Vec<String>> = VECTORS
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .filter(|fields| fields[0] == kind)
            .map(|fields| fields[1..].iter().map(|f| f.to_string()).collect())
            .collect();
        assert!(found.len() > 5, "few {kind} vectors");
        found
    }

    #[test]
    fn merge_vectors() {
        for v in vectors("merge") {
            assert_eq!(v.len(), 3, "{v:?}");
            let existing = (v[0] != "<unset>").then(|| unescape(&v[0]));
            let token = unescape(&v[1]);
            let got = merge_options(existing.as_deref(), &token);
            if v[2] == "<error>" {
                assert!(got.is_err(), "{v:?}: {got:?}");
            } else {
                let expected = unescape(&v[2]);
                assert_eq!(got.as_deref(), Ok(expected.as_str()), "{v:?}");
                // Idempotent: a child process that inherits the value merges again.
                assert_eq!(
                    merge_options(Some(&expected), &token).as_deref(),
                    Ok(expected.as_str())
                );
            }
        }
    }

    #[test]
    fn check_vectors() {
        for v in vectors("check") {
            assert_eq!(v.len(), 2, "{v:?}");
            let token = unescape(&v[0]);
            let problem = unescape(&v[1]);
            match token_problem(&token) {
                None => assert_eq!(problem, "ok", "{v:?}"),
                Some(got) => assert_eq!(got, problem, "{v:?}"),
            }
        }
    }

    #[test]
    fn the_message_never_contains_the_token() {
        for token in ["secret,1", "secret 1", "secret=1", "sécret"] {
            let err = check_token(token).unwrap_err().to_string();
            assert!(!err.contains("secret") && !err.contains("sécret"), "{err}");
            assert!(err.starts_with("SALUS_TOKEN contains "), "{err}");
        }
        let long = "s".repeat(300);
        let err = check_token(&long).unwrap_err().to_string();
        assert!(
            err.starts_with("SALUS_TOKEN is longer than 256 characters ("),
            "{err}"
        );
        assert!(!err.contains("sss"), "{err}");
    }

    #[test]
    fn plan_leaves_the_variable_alone_without_a_valid_token_or_a_change() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(plan(None, os("a=1")), Ok(None));
        assert_eq!(plan(os(""), os("a=1")), Ok(None));
        assert!(plan(os("a b"), os("a=1")).is_err());
        assert_eq!(
            plan(os("abc"), None),
            Ok(Some(
                b"grpc.primary_user_agent=\"salus1.abc\",grpc.enable_http_proxy=0".to_vec()
            ))
        );
        let merged = "a=1,grpc.primary_user_agent=\"salus1.abc\",grpc.enable_http_proxy=0";
        assert_eq!(plan(os("abc"), os(merged)), Ok(None));
        // Not UTF-8: the token is refused; the user's own bytes pass through untouched.
        let bad = OsStr::from_bytes(b"ab\xffc");
        assert!(plan(Some(bad), None).is_err());
        let theirs = OsStr::from_bytes(b"x=\"\xff\"");
        assert_eq!(
            plan(os("abc"), Some(theirs)).unwrap().unwrap(),
            b"x=\"\xff\",grpc.primary_user_agent=\"salus1.abc\",grpc.enable_http_proxy=0"
        );
    }
}
