"""Process and ledger helpers shared by the client tests.

The stack under test is always, on loopback only:

    real client ──► oceancode-proxy ──► tap.py (records) ──► oceancode-fakeup

Binaries come from $OCEANCODE_BIN_DIR (default: <repo>/target/release), the npm
clients from $OCEANCODE_NODE_BIN (default: clients/.deps/node/node_modules/.bin).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN_DIR = Path(os.environ.get("OCEANCODE_BIN_DIR", ROOT / "target" / "release"))
PROXY_BIN = BIN_DIR / "oceancode-proxy"
FAKEUP_BIN = BIN_DIR / "oceancode-fakeup"
NODE_BIN = Path(os.environ.get("OCEANCODE_NODE_BIN", HERE / ".deps" / "node" / "node_modules" / ".bin"))

# The start of the tideline stub line (SPEC §4).
STUB_PREFIX = "[Earlier content of this session is past the tideline"


def base_env(home: Path) -> dict:
    """A clean environment: a private HOME, no real credentials or endpoints."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "SYSTEMROOT", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(home)
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    env["XDG_DATA_HOME"] = str(home / ".local" / "share")
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    # Never let anything reach a real provider or a proxy from the host.
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


class Proc:
    """A background process whose first matching output line gives its URL."""

    def __init__(self, name: str, cmd: list[str], log_dir: Path, env: dict,
                 ready: str, stream: str = "stdout", timeout: float = 30.0, cwd: Path | None = None):
        self.name = name
        self.cmd = cmd
        self.log_path = log_dir / f"{name}.log"
        self.out_path = log_dir / f"{name}.out"
        self._log = open(self.log_path, "wb")
        self._out = open(self.out_path, "wb")
        pipe_out = stream == "stdout"
        self.p = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            cwd=str(cwd) if cwd else None,
            stdout=subprocess.PIPE if pipe_out else self._out,
            stderr=subprocess.PIPE if not pipe_out else self._log,
            start_new_session=True,
        )
        pipe = self.p.stdout if pipe_out else self.p.stderr
        sink = self._out if pipe_out else self._log
        self.url: str | None = None
        found = threading.Event()
        rx = re.compile(ready)

        def pump():
            for line in iter(pipe.readline, b""):
                sink.write(line)
                sink.flush()
                if not found.is_set():
                    m = rx.search(line.decode("utf-8", "replace"))
                    if m:
                        self.url = m.group(1)
                        found.set()
            pipe.close()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not found.wait(timeout):
            self.stop()
            raise RuntimeError(f"{name} did not start: {self.read_log()[-2000:]}")

    def read_log(self) -> str:
        text = ""
        for p in (self.log_path, self.out_path):
            try:
                text += p.read_text(errors="replace")
            except OSError:
                pass
        return text

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._pump.join(2)
        self._log.close()
        self._out.close()
        return self.p.returncode


def start_fake(work: Path, script: dict | list | None = None, max_context: int | None = None,
               env: dict | None = None, name: str = "fakeup", gzip: bool = False,
               args: list[str] | None = None) -> Proc:
    """The fake upstream; `args`: more of its flags (`--count-max-tokens`, `--overflow-in-stream`)."""
    cmd = [str(FAKEUP_BIN), "--listen", "127.0.0.1:0"] + (["--gzip"] if gzip else []) + list(args or [])
    if script is not None:
        sp = work / f"{name}-script.json"
        sp.write_text(json.dumps(script, indent=1))
        cmd += ["--script", str(sp)]
    if max_context:
        cmd += ["--max-context", str(max_context)]
    e = dict(env or base_env(work / "home"))
    e["RUST_LOG"] = "debug"
    return Proc(name, cmd, work, e, r"listening on (http://\S+)", "stdout")


class TapProc(Proc):
    def wait(self, n: int, timeout: float = 10.0) -> None:
        """Waits until at least n exchanges are recorded (a client may stop reading
        at the terminal event, before the tap has seen the end of the body)."""
        deadline = time.monotonic() + timeout
        while len(self.entries()) < n and time.monotonic() < deadline:
            time.sleep(0.02)

    def quiesce(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Waits until no exchange was recorded for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = len(self.entries())
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.02)

    def entries(self) -> list[dict]:
        out = []
        try:
            with open(self.jsonl, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if line:
                        out.append(json.loads(line))
        except FileNotFoundError:
            pass
        return out

    def model_requests(self, quiesce: bool = True) -> list[dict]:
        """Recorded model requests (not count_tokens), with the body parsed (after
        the log went quiet: the last exchange is logged when its body ends)."""
        if quiesce:
            self.quiesce()
        out = []
        for e in self.entries():
            path = e["path"].split("?")[0]
            gemini = path.startswith("/v1beta/models/") and path.endswith(
                (":generateContent", ":streamGenerateContent"))
            if gemini or path in ("/v1/messages", "/v1/chat/completions", "/v1/responses"):
                try:
                    e["json"] = json.loads(e["body"])
                except ValueError:
                    e["json"] = None
                out.append(e)
        return out


def start_tap(work: Path, upstream: str, name: str = "tap", end_delay_ms: int = 0) -> TapProc:
    jsonl = work / f"{name}.jsonl"
    cmd = [sys.executable, str(HERE / "tap.py"), "--upstream", upstream, "--log", str(jsonl),
           "--end-delay-ms", str(end_delay_ms)]
    t = TapProc.__new__(TapProc)
    t.jsonl = jsonl
    Proc.__init__(t, name, cmd, work, base_env(work / "home"), r"listening on (http://\S+)", "stdout")
    return t


def start_proxy(work: Path, upstream: str, data_dir: Path, tideline: str | None = None,
                extra_env: dict | None = None, name: str = "proxy", cwd: Path | None = None) -> Proc:
    cmd = [str(PROXY_BIN), "--data-dir", str(data_dir), "serve", "--listen", "127.0.0.1:0",
           "--anthropic-upstream", upstream, "--openai-upstream", upstream,
           "--gemini-upstream", upstream]
    if tideline:
        cmd += ["--tideline", tideline]
    env = base_env(work / "home")
    env["OCEANCODE_LOG"] = os.environ.get("OCEANCODE_LOG", "info,oceancode_proxy=debug")
    env.update(extra_env or {})
    p = Proc(name, cmd, work, env, r"oceancode-proxy listening on (http://\S+)", "stderr", cwd=cwd)
    # Its admin API needs the token it made in its data dir.
    _ADMIN_TOKENS[p.url] = (Path(cwd) if cwd else Path.cwd()) / data_dir / "admin-token"
    return p


# Proxy URL → its admin token file (read when an admin request is sent).
_ADMIN_TOKENS: dict[str, Path] = {}


def admin_headers(url: str) -> dict:
    """`authorization: Bearer <token>` for a request to a proxy started here."""
    for base, f in _ADMIN_TOKENS.items():
        if url.startswith(base):
            try:
                return {"authorization": "Bearer " + f.read_text().strip()}
            except OSError:
                return {}
    return {}


@dataclass
class Run:
    """A finished client run."""
    cmd: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    def tail(self, n: int = 3000) -> str:
        return f"exit={self.code} timed_out={self.timed_out}\n--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


def run(cmd: list[str], env: dict, cwd: Path, timeout: float, log: Path | None = None,
        stdin: str | None = None) -> Run:
    """Runs a client to completion, killing its whole process group on timeout."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(stdin.encode() if stdin is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    r = Run(cmd, p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
            time.monotonic() - t0, timed_out)
    if log is not None:
        log.write_text(f"$ {' '.join(cmd)}\n{r.tail(10**9)}\n")
    return r


@dataclass
class Ledger:
    """Read-only view of <data>/oceancode.db."""
    data_dir: Path
    _conn: sqlite3.Connection | None = field(default=None, repr=False)

    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = f"file:{self.data_dir / 'oceancode.db'}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, timeout=10)
            self._conn.row_factory = sqlite3.Row
        return self._conn

    def q(self, sql: str, *args) -> list[sqlite3.Row]:
        return list(self.conn().execute(sql, args))

    def sessions(self) -> list[sqlite3.Row]:
        return self.q("SELECT * FROM sessions ORDER BY created_ms")

    def rows(self, session: str) -> list[sqlite3.Row]:
        return self.q("SELECT * FROM rows WHERE session=? ORDER BY seq", session)

    def cuts(self, session: str | None = None) -> list[sqlite3.Row]:
        if session is None:
            return self.q("SELECT * FROM cuts ORDER BY ts_ms")
        return self.q("SELECT * FROM cuts WHERE session=? ORDER BY ts_ms", session)

    def steps(self, session: str) -> list[sqlite3.Row]:
        return self.q("SELECT * FROM steps WHERE session=? ORDER BY step", session)

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def canon(v):
    """Normalize a message the way SPEC §2 compares them: cache_control removed,
    a string content ≡ one text block."""
    if isinstance(v, dict):
        out = {k: canon(x) for k, x in v.items() if k != "cache_control"}
        if isinstance(out.get("content"), str) and "role" in out:
            out["content"] = [{"type": "text", "text": out["content"]}]
        return out
    if isinstance(v, list):
        return [canon(x) for x in v]
    return v


def http_json(url: str, method: str = "GET", body: dict | None = None, timeout: float = 10):
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **admin_headers(url)})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def metrics(proxy_url: str) -> dict[str, float]:
    text = http_json(proxy_url + "/metrics")
    out = {}
    for line in str(text).splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out
