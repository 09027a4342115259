"""The tenant token: SALUS_TOKEN, carried in every gRPC call's user-agent header as the word `salus1.<token>`.

A stock TensorFlow client has one way to set a channel's user agent: TF_GRPC_DEFAULT_OPTIONS, which TensorFlow
reads once, when it creates its first gRPC channel (tensorflow/core/distributed_runtime/rpc/grpc_channel.cc).
Its format is a comma-separated list of `key=value`; a quoted value ("...", C-unescaped) is a string channel
argument, an unquoted integer an int argument. salus_tf.pth calls apply_env() at interpreter start, before a
script can import TensorFlow, whenever SALUS_TOKEN is set; it adds

    grpc.primary_user_agent="salus1.<token>"   every call of every service carries it in its user agent
    grpc.enable_http_proxy=0                   an http_proxy setting does not route the connection (and the
                                               token) through a proxy

to the value the user set. gRPC C++ puts its own name first: TensorFlow 2.21's calls (gRPC 1.74) carry
`grpc-c++/1.74.0 salus1.<token> grpc-c/49.0.0 (linux; chttp2)`; grpcio's (grpc_options()) start with the token.
An invalid token is reported on stderr in one line and not sent (the server then answers UNAUTHENTICATED, saying
what to set). The adapter never prints the token, and keeps it out of the session config (TensorFlow logs
ConfigProto at INFO); TensorFlow itself prints TF_GRPC_DEFAULT_OPTIONS only at verbose level 3
(TF_CPP_MAX_VLOG_LEVEL=3).

Pure standard library and cheap (imported at every interpreter start that has SALUS_TOKEN set).
tf_adapter/src/token.rs is the same for C-API programs (libsalus_tf.so); both pass the test vectors of
tf_adapter/src/token_vectors.txt.
"""

from __future__ import annotations

import os

from ._log import warn as _warn

ENV_TOKEN = "SALUS_TOKEN"
ENV_TF_OPTIONS = "TF_GRPC_DEFAULT_OPTIONS"
USER_AGENT_KEY = "grpc.primary_user_agent"
PROXY_KEY = "grpc.enable_http_proxy"
PROXY_ENTRY = PROXY_KEY + "=0"
USER_AGENT_PREFIX = "salus1."
MAX_LEN = 256
# ',' and '=' separate entries and keys; '"' ends the quoted value; TensorFlow C-unescapes the value, so '\'
# would change it.
FORBIDDEN = ',="\\'
RULE = 'a token is 1 to 256 printable ASCII characters, without spaces or any of , = " \\'
# What str.strip() removes in Rust's trim_matches(char::is_ascii_whitespace): no vertical tab.
_WS = " \t\n\r\f"


_from_env: bool | None = None  # apply_env()'s result on os.environ, once it has run


class TokenError(ValueError):
    """A SALUS_TOKEN that cannot be carried; the message never contains the token."""


def token_problem(token: str) -> str | None:
    """Why `token` cannot be sent (a phrase without the token in it), or None when it can."""
    if not token:
        return "is empty"
    if len(token) > MAX_LEN:
        return f"is longer than {MAX_LEN} characters"
    for c in token:
        if c in " \t\n\r\f\v":
            return "contains whitespace"
        if ord(c) < 0x20 or ord(c) == 0x7F:
            return "contains a control character"
        if ord(c) > 0x7F:
            return "contains a non-ASCII character"
        if c in FORBIDDEN:
            return f"contains '{c}'"
    return None


def check_token(token: str) -> str:
    problem = token_problem(token)
    if problem is not None:
        raise TokenError(f"{ENV_TOKEN} {problem} ({RULE})")
    return token


def user_agent_entry(token: str) -> str:
    return f'{USER_AGENT_KEY}="{USER_AGENT_PREFIX}{check_token(token)}"'


def merge_options(existing: str | None, token: str) -> str:
    """TF_GRPC_DEFAULT_OPTIONS with the token's entries added to `existing` (None: unset).

    The user's entries are kept as they are, in order, and ours come last; merging twice changes nothing (a
    child process inherits the merged value). Keys are compared as TensorFlow splits them, without trimming.
    - an entry equal to ours is kept where it is, not repeated;
    - any other grpc.primary_user_agent entry (the user's own agent, or a parent's other token) is removed:
      TensorFlow passes duplicate keys on to gRPC, which joins them all into the header (measured with gRPC
      1.27 in TensorFlow 2.16 and 1.74 in 2.21: 'grpc-c++/1.74.0 mine/1 salus1.abc grpc-c/...'), so another
      token, or an agent of the user's that looks like one, would reach the server next to ours; removed, the
      server has exactly one token to read;
    - a grpc.enable_http_proxy the user set (to anything) is their choice and kept; ours is added otherwise;
    - empty (or whitespace-only) entries, which TensorFlow refuses with an error line each, are dropped.
    Raises TokenError for an invalid token.
    """
    ours = user_agent_entry(token)
    kept: list[str] = []
    have_agent = have_proxy = False
    for entry in (existing or "").split(","):
        if not entry.strip(_WS):
            continue
        key = entry.split("=", 1)[0]
        if key == USER_AGENT_KEY:
            if entry == ours and not have_agent:
                kept.append(entry)
                have_agent = True
            continue
        if key == PROXY_KEY:
            have_proxy = True
        kept.append(entry)
    if not have_agent:
        kept.append(ours)
    if not have_proxy:
        kept.append(PROXY_ENTRY)
    return ",".join(kept)


def env_token(environ=None) -> str | None:
    """SALUS_TOKEN, or None when unset or empty (as for the other SALUS_* variables)."""
    value = (os.environ if environ is None else environ).get(ENV_TOKEN)
    return value or None


def grpc_options(environ=None) -> list:
    """Channel options for the adapter's own grpcio calls to the server: the same user agent (and no proxy) as
    TensorFlow's channels; empty without a valid token."""
    token = env_token(environ)
    if token is None or token_problem(token) is not None:
        return []
    return [(USER_AGENT_KEY, USER_AGENT_PREFIX + token), (PROXY_KEY, 0)]


def apply_env(environ=None) -> bool:
    """Called by salus_tf.pth when SALUS_TOKEN is set: merges the token into TF_GRPC_DEFAULT_OPTIONS.

    True when the variable now carries the token. An invalid token: one line on stderr, the variable
    unchanged. Never raises (it runs at every interpreter start). On os.environ (environ None) it acts once:
    site may process a venv's .pth files twice, and the warning is said once."""
    global _from_env
    if environ is not None:
        return _apply(environ)
    if _from_env is None:
        _from_env = _apply(os.environ)
    return _from_env


def _apply(env) -> bool:
    try:
        token = env_token(env)
        if token is None:
            return False
        try:
            merged = merge_options(env.get(ENV_TF_OPTIONS), token)
        except TokenError as e:
            _warn(f"{e}; not sent")
            return False
        if env.get(ENV_TF_OPTIONS) != merged:
            env[ENV_TF_OPTIONS] = merged
        return True
    except Exception as e:  # never break an interpreter start
        _warn(f"{ENV_TOKEN} could not be applied ({type(e).__name__}); not sent")
        return False
