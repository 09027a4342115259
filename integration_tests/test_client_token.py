"""SALUS_TOKEN: clients carry the tenant token in every gRPC call's user-agent header (a word `salus1.<token>`).

A stock TensorFlow client sets its channels' user agent only from TF_GRPC_DEFAULT_OPTIONS (read once, at its first
gRPC channel). The Python adapter (python/src/salus/_token.py, run by salus_tf.pth at every interpreter start with
SALUS_TOKEN set) and the C-API shim (tf_adapter/src/token.rs, a load-time constructor of libsalus_tf.so) add
`grpc.primary_user_agent="salus1.<token>"` and `grpc.enable_http_proxy=0` to it. Checked here, without a Salus
server:

- the pure functions (validation, merging) against tf_adapter/src/token_vectors.txt, the vectors the shim's Rust
  unit tests also pass, so both adapters merge alike;
- the .pth path end to end in the venv's interpreter (token only, a value of the user's, an invalid token, none,
  a child process that inherits the merged value, SALUS_SERVER as well);
- what a real client sends: a raw TCP listener here speaks just enough HTTP/2 (an empty SETTINGS frame, then
  frames up to the first HEADERS, decoded with hpack_min.py) to read the first request's user agent, from a TF1
  session script and from the C program c_programs/train.c with the shim preloaded. Neither gets an answer: each
  ends at its 3 s operation timeout. A dead http_proxy in their environment shows the proxy is bypassed.

Cost: about 8 interpreter starts without TensorFlow (well under a second each), one TensorFlow import (the TF1
script, ~5-10 s), one `cc` build of train.c and one run of it (TensorFlow's C library loaded, ~5 s), each client
waiting out its 3 s timeout: about 15 s in all on 2 cores. The shim is SALUS_TF_SHIM or <target>/release/libsalus_tf.so, as in
test_c_api_shim.py.
"""

from __future__ import annotations

import queue
import socket
import subprocess
import threading
import time

import pytest

from conftest import REPO, TESTS, child_env, compile_c, venv_python
from hpack_min import Decoder, HpackError, huffman_decode, HUFFMAN_LENGTHS
from test_c_api_shim import shim_path, tf_dir
from test_python_adapter import salus_package  # noqa: F401  (autouse: the venv has this tree's python/)

VECTORS = REPO / "tf_adapter" / "src" / "token_vectors.txt"
UA = 'grpc.primary_user_agent="salus1.{}"'
PROXY = "grpc.enable_http_proxy=0"
CLIENT_TIMEOUT_S = 120
PRINT_OPTIONS = 'import os; print(os.environ.get("TF_GRPC_DEFAULT_OPTIONS"))'


def token_env(**extra: str) -> dict:
    """child_env without the caller's SALUS_*, TF_GRPC_DEFAULT_OPTIONS or proxy settings, plus `extra`."""
    drop = {"TF_GRPC_DEFAULT_OPTIONS", "LD_PRELOAD", "http_proxy", "https_proxy", "grpc_proxy", "no_proxy",
            "no_grpc_proxy"}
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_") and k.lower() not in drop}
    env.update(extra)
    return env


# --- the shared vectors --------------------------------------------------------------------------------------

@pytest.fixture
def tok():
    """salus._token as installed in the venv (after salus_package has made the install current)."""
    from salus import _token
    return _token


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c != "\\":
            out.append(c)
            i += 1
        elif field[i + 1] == "\\":
            out.append("\\")
            i += 2
        elif field[i + 1] == "x":
            out.append(chr(int(field[i + 2:i + 4], 16)))
            i += 4
        elif field[i + 1] == "u":
            end = field.index("}", i)
            out.append(chr(int(field[i + 3:end], 16)))
            i = end + 1
        else:
            raise ValueError(f"bad escape in {field!r}")
    return "".join(out)


def _vectors(kind: str) -> list:
    found = [line.split("\t")[1:] for line in VECTORS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#") and line.split("\t")[0] == kind]
    assert len(found) > 5, f"few {kind} vectors in {VECTORS}"
    return found


@pytest.mark.parametrize("existing,token,expected", _vectors("merge"))
def test_merge_vectors(tok, existing, token, expected):
    existing = None if existing == "<unset>" else _unescape(existing)
    token = _unescape(token)
    if expected == "<error>":
        with pytest.raises(tok.TokenError):
            tok.merge_options(existing, token)
        return
    expected = _unescape(expected)
    assert tok.merge_options(existing, token) == expected
    assert tok.merge_options(expected, token) == expected  # a child process merges again: no change


@pytest.mark.parametrize("token,problem", _vectors("check"))
def test_check_vectors(tok, token, problem):
    got = tok.token_problem(_unescape(token))
    assert (got or "ok") == _unescape(problem)


def test_messages_never_contain_the_token(tok):
    for token in ("secret,1", "secret 1", "secret=1", "s\u00e9cret", "s" * 300):
        with pytest.raises(tok.TokenError) as e:
            tok.check_token(token)
        message = str(e.value)
        assert message.startswith("SALUS_TOKEN ") and "secret" not in message and "sss" not in message, message


def test_apply_env_on_a_mapping(tok):
    env = {"SALUS_TOKEN": "abc123", "TF_GRPC_DEFAULT_OPTIONS": "a=1"}
    assert tok.apply_env(env) is True
    assert env["TF_GRPC_DEFAULT_OPTIONS"] == f"a=1,{UA.format('abc123')},{PROXY}"
    assert tok.apply_env({}) is False
    unchanged = {"SALUS_TOKEN": "", "TF_GRPC_DEFAULT_OPTIONS": "a=1"}
    assert tok.apply_env(unchanged) is False and unchanged["TF_GRPC_DEFAULT_OPTIONS"] == "a=1"


def test_grpc_options_for_the_adapters_own_calls(tok):
    assert tok.grpc_options({"SALUS_TOKEN": "abc"}) == [("grpc.primary_user_agent", "salus1.abc"),
                                                           ("grpc.enable_http_proxy", 0)]
    assert tok.grpc_options({}) == []
    assert tok.grpc_options({"SALUS_TOKEN": "a b"}) == []


# --- hpack_min against RFC 7541 Appendix C -------------------------------------------------------------------

RFC7541_C = [  # (example, table size, hex block, headers, dynamic table size after it); a ".1" starts a table
    ("C.2.1", 4096, "400a637573746f6d2d6b65790d637573746f6d2d686561646572", [("custom-key", "custom-header")], 55),
    ("C.2.2", 4096, "040c2f73616d706c652f70617468", [(":path", "/sample/path")], 0),
    ("C.2.3", 4096, "100870617373776f726406736563726574", [("password", "secret")], 0),
    ("C.2.4", 4096, "82", [(":method", "GET")], 0),
    ("C.3.1", 4096, "828684410f7777772e6578616d706c652e636f6d",
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")], 57),
    ("C.3.2", 4096, "828684be58086e6f2d6361636865",
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"),
      ("cache-control", "no-cache")], 110),
    ("C.3.3", 4096, "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
     [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
      ("custom-key", "custom-value")], 164),
    ("C.4.1", 4096, "828684418cf1e3c2e5f23a6ba0ab90f4ff",
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")], 57),
    ("C.4.2", 4096, "828684be5886a8eb10649cbf",
     [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com"),
      ("cache-control", "no-cache")], 110),
    ("C.4.3", 4096, "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
     [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"), (":authority", "www.example.com"),
      ("custom-key", "custom-value")], 164),
    ("C.5.1", 256, "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e"
                   "1768747470733a2f2f7777772e6578616d706c652e636f6d",
     [(":status", "302"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
      ("location", "https://www.example.com")], 222),
    ("C.5.2", 256, "4803333037c1c0bf",
     [(":status", "307"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
      ("location", "https://www.example.com")], 222),
    ("C.5.3", 256, "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d"
                   "4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b207665"
                   "7273696f6e3d31",
     [(":status", "200"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
      ("location", "https://www.example.com"), ("content-encoding", "gzip"),
      ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")], 215),
    ("C.6.1", 256, "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97"
                   "c8e9ae82ae43d3",
     [(":status", "302"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
      ("location", "https://www.example.com")], 222),
    ("C.6.2", 256, "4883640effc1c0bf",
     [(":status", "307"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
      ("location", "https://www.example.com")], 222),
    ("C.6.3", 256, "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5"
                   "b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
     [(":status", "200"), ("cache-control", "private"), ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
      ("location", "https://www.example.com"), ("content-encoding", "gzip"),
      ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")], 215),
]


def test_hpack_min_decodes_rfc7541_appendix_c():
    decoder = None
    for example, table_size, block, headers, size in RFC7541_C:
        if example.startswith("C.2") or example.endswith(".1"):
            decoder = Decoder(table_size)
        assert decoder.decode(bytes.fromhex(block)) == headers, example
        assert decoder.size == size, example


def test_hpack_min_huffman_table_is_a_complete_prefix_code():
    from fractions import Fraction
    assert len(HUFFMAN_LENGTHS) == 257
    assert sum(Fraction(1, 2 ** n) for n in HUFFMAN_LENGTHS) == 1  # Kraft: complete, every code decodable
    with pytest.raises(HpackError):
        huffman_decode(b"\x00")  # '0' (00000) followed by padding that is not all ones


# --- the .pth in a real interpreter ---------------------------------------------------------------------------

def run_venv(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([venv_python(), "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)


def printed_options(env: dict) -> tuple[str, str]:
    proc = run_venv(PRINT_OPTIONS, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip(), proc.stderr


def test_pth_sets_the_options_from_salus_token_alone():
    out, err = printed_options(token_env(SALUS_TOKEN="abc123"))
    assert out == f"{UA.format('abc123')},{PROXY}"
    assert err == ""


def test_pth_appends_to_the_users_options_and_replaces_their_user_agent():
    out, _ = printed_options(token_env(SALUS_TOKEN="abc123", TF_GRPC_DEFAULT_OPTIONS="grpc.keepalive_time_ms=10000"))
    assert out == f"grpc.keepalive_time_ms=10000,{UA.format('abc123')},{PROXY}"
    theirs = 'grpc.primary_user_agent="mine/1",grpc.enable_http_proxy=1'
    out, _ = printed_options(token_env(SALUS_TOKEN="abc123", TF_GRPC_DEFAULT_OPTIONS=theirs))
    assert out == f"grpc.enable_http_proxy=1,{UA.format('abc123')}"


def test_pth_invalid_token_is_one_line_and_not_sent():
    secret = "top secret"
    out, err = printed_options(token_env(SALUS_TOKEN=secret, TF_GRPC_DEFAULT_OPTIONS="a=1"))
    assert out == "a=1"
    assert err.startswith("salus: SALUS_TOKEN contains whitespace (") and err.endswith("; not sent\n"), err
    assert err.count("\n") == 1 and secret not in err and "secret" not in err, err
    out, err = printed_options(token_env(SALUS_TOKEN="x" * 257))
    assert out == "None" and err.startswith("salus: SALUS_TOKEN is longer than 256 characters"), err


def test_pth_without_salus_token_changes_nothing():
    probe = PRINT_OPTIONS + "; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'salus'))"
    proc = run_venv(probe, token_env())
    assert proc.stdout.split("\n")[:2] == ["None", "[]"], proc.stdout
    proc = run_venv(probe, token_env(SALUS_TOKEN="", TF_GRPC_DEFAULT_OPTIONS="a=1"))  # empty: as unset
    assert proc.stdout.split("\n")[:2] == ["a=1", "[]"] and proc.stderr == "", proc


def test_pth_child_process_inherits_without_duplicates():
    code = ("import os, subprocess, sys; print(os.environ['TF_GRPC_DEFAULT_OPTIONS']); sys.stdout.flush(); "
            f"subprocess.run([sys.executable, '-c', {PRINT_OPTIONS!r}], check=True)")
    proc = run_venv(code, token_env(SALUS_TOKEN="abc123", TF_GRPC_DEFAULT_OPTIONS="a=1"))
    assert proc.returncode == 0, proc.stderr
    expected = f"a=1,{UA.format('abc123')},{PROXY}"
    assert proc.stdout.splitlines() == [expected, expected]


def test_pth_with_server_and_token_stays_cheap():
    probe = (PRINT_OPTIONS + "; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'salus'), "
             "'grpc' in sys.modules, 'tensorflow' in sys.modules)")
    proc = run_venv(probe, token_env(SALUS_TOKEN="abc123", SALUS_SERVER="127.0.0.1:1"))
    assert proc.stdout.splitlines() == [f"{UA.format('abc123')},{PROXY}",
                                        "['salus', 'salus._config', 'salus._hook', 'salus._log', 'salus._token'] False False"]
    assert proc.stderr == ""


# --- what a real client sends ---------------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = bytes.fromhex("000000040000000000")
SETTINGS_ACK = bytes.fromhex("000000040100000000")
HEADERS, SETTINGS, CONTINUATION = 1, 4, 9
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20


class FirstRequestHeaders:
    """A listener on 127.0.0.1 that speaks just enough HTTP/2 to read each connection's first request headers.

    Per connection: sends an empty SETTINGS frame (a gRPC client waits for it before its first HEADERS), reads
    frames up to the first HEADERS (and its CONTINUATIONs), decodes the block and puts the headers in `seen`.
    It never answers: the connection stays open until the client gives up or the listener closes. A connection
    that closes before the preface (the shim's reachability probe) is ignored."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.seen: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read(conn, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _frame(self, conn):
        head = self._read(conn, 9)
        if head is None:
            return None
        length = int.from_bytes(head[:3], "big")
        ftype, flags = head[3], head[4]
        payload = self._read(conn, length) if length else b""
        if payload is None:
            return None
        return ftype, flags, payload

    def _serve(self, conn):
        try:
            conn.settimeout(CLIENT_TIMEOUT_S)
            conn.sendall(EMPTY_SETTINGS)
            preface = self._read(conn, len(PREFACE))
            if preface is None:
                return  # a bare TCP probe
            if preface != PREFACE:
                self.errors.append(f"not an HTTP/2 preface: {preface!r}")
                return
            decoder = Decoder()
            while True:
                frame = self._frame(conn)
                if frame is None:
                    return
                ftype, flags, payload = frame
                if ftype == SETTINGS and not flags & 0x1:
                    conn.sendall(SETTINGS_ACK)
                if ftype != HEADERS:
                    continue
                block = payload
                if flags & PADDED:
                    pad = block[0]
                    block = block[1:len(block) - pad]
                if flags & PRIORITY:
                    block = block[5:]
                while not flags & END_HEADERS:
                    frame = self._frame(conn)
                    if frame is None or frame[0] != CONTINUATION:
                        self.errors.append("HEADERS without its CONTINUATION")
                        return
                    _, flags, more = frame
                    block += more
                self.seen.put(dict(decoder.decode(block)))
                # Keep reading (and ignoring) until the client closes, so it is not told anything.
                while self._frame(conn) is not None:
                    pass
                return
        except (OSError, HpackError) as e:
            self.errors.append(f"{type(e).__name__}: {e}")

    def first(self, proc: subprocess.Popen, hint: str, timeout: float = CLIENT_TIMEOUT_S) -> dict:
        """The first request's headers; fails (saying `hint`) when the client exits, or the time runs out, without
        sending any."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.seen.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None and self.seen.empty():
                    out, err = proc.communicate()
                    pytest.fail(f"the client exited ({proc.returncode}) without sending a request ({hint}); "
                                f"listener errors: {self.errors}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}")
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no request within {timeout}s ({hint}); listener errors: {self.errors}\n"
                    f"stderr:\n{err[-4000:]}")

    def close(self):
        self._closed = True
        self.sock.close()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass


@pytest.fixture
def listener():
    server = FirstRequestHeaders()
    yield server
    server.close()


def assert_token_in_user_agent(headers: dict, token: str) -> None:
    """`salus1.<token>` is one space-separated word of the user agent, the only one starting with `salus1.`.

    Not its first word: gRPC C++ (1.74, TensorFlow 2.21) puts its own `grpc-c++/<version>` first and joins the
    primary user agents after it (measured: 'grpc-c++/1.74.0 salus1.abc123 grpc-c/49.0.0 (linux; chttp2)')."""
    assert headers.get(":path", "").startswith("/tensorflow."), headers
    words = headers.get("user-agent", "").split(" ")
    assert [w for w in words if w.startswith("salus1.")] == [f"salus1.{token}"], headers


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    """Waits for a client that got no answer (its 3 s operation timeout ends it); kills it if it hangs."""
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


# A proxy that nobody listens on: were the connection sent through it, no request would arrive (measured: without
# grpc.enable_http_proxy=0 none does).
DEAD_PROXY = {"http_proxy": "http://127.0.0.1:9", "grpc_proxy": "http://127.0.0.1:9"}
NO_REQUEST = "without grpc.enable_http_proxy=0 in TF_GRPC_DEFAULT_OPTIONS the client goes to a dead proxy"

TF1_CLIENT = """
import sys
import tensorflow as tf
graph = tf.Graph()
with graph.as_default():
    c = tf.constant(1.0)
config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=3000)
with tf.compat.v1.Session(sys.argv[1], graph=graph, config=config) as sess:
    try:
        sess.run(c)
    except tf.errors.OpError as e:
        print("no answer:", type(e).__name__)
"""


def test_tf1_session_sends_the_token_in_its_user_agent(listener):
    # SALUS_TOKEN alone (no SALUS_SERVER): the script names the server itself.
    env = token_env(SALUS_TOKEN="abc123", **DEAD_PROXY)
    proc = subprocess.Popen([venv_python(), "-c", TF1_CLIENT, f"grpc://{listener.address}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        headers = listener.first(proc, f"{NO_REQUEST}: is the venv's salus package this tree's python/?")
    finally:
        finish(proc)
    assert_token_in_user_agent(headers, "abc123")


# ConfigProto{operation_timeout_in_ms: 3000} and GraphDef{node{name: "init" op: "NoOp"}}, encoded by hand (no
# TensorFlow import for them).
TIMEOUT_CONFIG = b"\x58\xb8\x17"
NOOP_GRAPH = b"\x0a\x0c\x0a\x04init\x12\x04NoOp"


def test_c_api_program_with_the_shim_sends_the_token_in_its_user_agent(listener, tmp_path):
    shim = shim_path()
    if not shim.exists():
        pytest.fail(f"{shim} not found: build it (cargo build --release -p salus-tf-adapter) or set SALUS_TF_SHIM")
    lib = tf_dir()
    train = compile_c(TESTS / "c_programs" / "train.c", tmp_path / "train", "-O1", f"-I{lib / 'include'}",
                      f"-L{lib}", f"-Wl,-rpath,{lib}",
                      libs=("-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2"))
    (tmp_path / "graph.pb").write_bytes(NOOP_GRAPH)
    (tmp_path / "config.pb").write_bytes(TIMEOUT_CONFIG)
    env = token_env(LD_PRELOAD=str(shim), SALUS_SERVER=listener.address, SALUS_TOKEN="abc123", **DEAD_PROXY)
    args = [str(train), str(tmp_path / "graph.pb"), "init", "init", "init", "1", str(tmp_path / "config.pb")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        headers = listener.first(proc, f"{NO_REQUEST}: is {shim} built from this tree? (cargo build --release "
                                       f"-p salus-tf-adapter, or SALUS_TF_SHIM)")
    finally:
        out, err = finish(proc)
    assert_token_in_user_agent(headers, "abc123")
    # It got no answer: the program's own error exit, with the init op's DEADLINE_EXCEEDED (or UNAVAILABLE).
    assert proc.returncode == 2 and "running the init op" in err, (proc.returncode, err[-2000:])
    assert "SALUS_TOKEN" not in err, err[-2000:]
