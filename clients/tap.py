"""A recording pass-through placed between oceancode-proxy and the fake upstream.

    python3 tap.py --upstream http://127.0.0.1:PORT --log FILE.jsonl

prints `listening on http://127.0.0.1:PORT` and forwards every request to the
upstream unchanged, streaming the response back chunk by chunk. Each exchange is
appended to the log as one JSON line:

    {"seq", "method", "path", "headers", "body", "status", "response"}

`headers` leaves out credentials; `body` is the request body as text (what the
upstream received from the proxy, byte for byte); `response` is the response
body as text (capped). The tests read this file to see exactly what the
upstream saw (stub lines, no compaction prompts, valid windows).

`--end-delay-ms N` holds the end of every streamed (chunked) body for N ms after
its last event, as a provider's stream may end a moment after its terminal event:
clients that stop reading at the terminal event (Codex does) then close the
connection before the body ends.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
}
SECRET = {"authorization", "x-api-key", "x-goog-api-key", "cookie"}
RESPONSE_CAP = 4 * 1024 * 1024


class Tap:
    def __init__(self, upstream: str, log_path: str, end_delay: float = 0.0):
        self.end_delay = end_delay
        u = urllib.parse.urlsplit(upstream)
        if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"tap: upstream must be a loopback http URL, got {upstream}")
        self.host = u.hostname
        self.port = u.port or 80
        self.log = open(log_path, "a", encoding="utf-8")
        self.lock = threading.Lock()
        self.seq = 0

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def record(self, entry: dict) -> None:
        line = json.dumps(entry, ensure_ascii=False)
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()


def make_handler(tap: Tap):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet
            pass

        def _forward(self):
            seq = tap.next_seq()
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn = http.client.HTTPConnection(tap.host, tap.port, timeout=600)
            entry = {
                "seq": seq,
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in headers.items() if k.lower() not in SECRET},
                "body": body.decode("utf-8", errors="replace"),
            }
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
            except OSError as e:
                entry["status"] = 502
                entry["response"] = f"tap: upstream failed: {e}"
                tap.record(entry)
                msg = json.dumps({"error": {"message": f"tap: {e}"}}).encode()
                self.send_response(502)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            entry["status"] = resp.status
            self.send_response(resp.status)
            clen = None
            for k, v in resp.getheaders():
                lk = k.lower()
                if lk in HOP:
                    continue
                if lk == "content-length":
                    clen = v
                self.send_header(k, v)
            chunked = clen is None and self.command != "HEAD"
            if chunked:
                self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            # The entry is recorded before the response completes (the last byte
            # of a fixed-length body, the terminating chunk of a chunked one), so
            # a client that has its answer always finds the exchange in the log.
            got = bytearray()
            try:
                if self.command == "HEAD":
                    tap.record({**entry, "response": ""})
                    return
                if not chunked:
                    data = resp.read()
                    got.extend(data[:RESPONSE_CAP])
                    entry["response"] = got.decode("utf-8", errors="replace")
                    if data:
                        self.wfile.write(data[:-1])
                        self.wfile.flush()
                    tap.record(entry)
                    self.wfile.write(data[-1:])
                    self.wfile.flush()
                    return
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    if len(got) < RESPONSE_CAP:
                        got.extend(chunk[: RESPONSE_CAP - len(got)])
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                entry["response"] = got.decode("utf-8", errors="replace")
                tap.record(entry)
                if tap.end_delay:
                    # A provider whose stream ends a moment after its last event.
                    time.sleep(tap.end_delay)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError as e:
                entry["error"] = str(e)
                entry["response"] = got.decode("utf-8", errors="replace")
                tap.record(entry)
                self.close_connection = True
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--listen-port", type=int, default=0)
    ap.add_argument("--end-delay-ms", type=int, default=0,
                    help="wait this long between the last chunk of a streamed body and its end")
    a = ap.parse_args()
    tap = Tap(a.upstream, a.log, a.end_delay_ms / 1000)
    srv = ThreadingHTTPServer(("127.0.0.1", a.listen_port), make_handler(tap))
    srv.daemon_threads = True
    print(f"listening on http://127.0.0.1:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
