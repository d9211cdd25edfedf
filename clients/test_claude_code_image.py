"""Claude Code reads images: its Read tool returns a `.png` as an image block
inside the tool_result. Through `oceancode-proxy serve` at its default line,
a small screenshot and then a 1 MB one must be priced as the provider prices
them (28×28-pixel patches), not by their base64 bytes: no cut, row estimates
near the formula, transcripts with a placeholder and never the data.

`OCEANCODE_BLESS=1` saves the request that carries the small image to
fixtures/captures/anthropic_12_read_png/ (replayed by tests/tests/media.rs).
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import struct
import zlib
from pathlib import Path

import agentcheck as ac
import harness as h
from test_claude_code import TIMEOUT, cc_cmd, cc_env, compaction_requests, events

CAPTURE = h.ROOT / "fixtures" / "captures" / "anthropic_12_read_png"


def png(w: int, h_: int, noise: int) -> bytes:
    """A decodable RGB PNG: `noise` bytes of noise, then a flat colour."""
    rnd = random.Random(w * 7919 + h_)
    row = 1 + 3 * w
    raw = bytearray(row * h_)
    for i in range(len(raw)):
        if i % row:
            raw[i] = rnd.getrandbits(8) if i < noise else 0xE0
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h_, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 1)) + chunk(b"IEND", b"")


def patches(w: int, h_: int) -> int:
    """Anthropic's rule for an image within its limits (long edge <= 1568 px,
    <= 1568 patches): one token per 28x28 patch."""
    return math.ceil(w / 28) * math.ceil(h_ / 28)


def image_blocks(msg: dict) -> list[dict]:
    out = []
    for b in msg.get("content") or []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "image":
            out.append(b)
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
            out += [c for c in b["content"] if isinstance(c, dict) and c.get("type") == "image"]
    return out


def img_size(data_b64: str) -> tuple[str, int, int]:
    """(media type, width, height) from a PNG or JPEG header."""
    b = base64.b64decode(data_b64)
    if b[:8] == b"\x89PNG\r\n\x1a\n":
        return ("image/png", *struct.unpack(">II", b[16:24]))
    assert b[:2] == b"\xff\xd8", b[:8]
    i = 2
    while i + 4 <= len(b):
        marker, length = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h_, w = struct.unpack(">HH", b[i + 5:i + 9])
            return ("image/jpeg", w, h_)
        i += 2 + length
    raise AssertionError("no JPEG frame header")


def test_claude_code_reads_screenshots_without_cutting(make_stack, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "small.png").write_bytes(png(800, 500, 12_000))
    big = png(1920, 1080, 1_000_000)
    assert len(big) > 900_000
    (proj / "screenshot.png").write_bytes(big)
    replies = [
        {"text": "Let me look.", "tool_calls": [{"name": "Read", "input": {"file_path": str(proj / "small.png")}}]},
        {"text": "And the full page.", "tool_calls": [{"name": "Read", "input": {"file_path": str(proj / "screenshot.png")}}]},
        {"text": "Both screenshots show the page. FINAL_ANSWER_MARKER"},
    ]
    st = make_stack(script={"replies": replies, "default": {"text": "Done. FINAL_ANSWER_MARKER"}})
    env = cc_env(st.home)
    env["ANTHROPIC_BASE_URL"] = st.proxy.url
    r = h.run(cc_cmd("Look at small.png and screenshot.png and tell me what they show."), env, proj,
              TIMEOUT, log=st.work / "client.log")
    assert r.code == 0 and not r.timed_out, r.tail()
    evs = events(r.stdout)
    result = [e for e in evs if e.get("type") == "result"][-1]
    assert result["subtype"] == "success" and "FINAL_ANSWER_MARKER" in result["result"], result
    assert not [e for e in evs if e.get("subtype") == "compact_boundary"]

    reqs = st.tap.model_requests()
    assert not compaction_requests(reqs)
    main = [q for q in reqs if q["json"] and q["json"].get("tools")]
    # The upstream saw the images as Claude Code sent them: image blocks in tool results.
    with_images = [q for q in main if any(image_blocks(m) for m in q["json"]["messages"])]
    assert len(with_images) >= 2, f"no image blocks upstream: {[len(q['body']) for q in main]}"
    last = with_images[-1]["json"]["messages"]
    # (Claude Code re-encodes a large image as JPEG, scaled to its own limits.)
    sizes = [img_size(b["source"]["data"]) for m in last for b in image_blocks(m)]
    assert len(sizes) == 2, sizes
    # No cut: a screenshot is ~1.5k tokens, not its bytes / 3.
    assert not any(h.STUB_PREFIX in q["body"] for q in reqs), "a screenshot cut the window"

    st.settle()
    sessions = [s for s in st.ledger.sessions() if s["client"] == "claude-code"]
    assert len(sessions) == 1, [dict(s) for s in sessions]
    sid = sessions[0]["id"]
    rows = st.ledger.rows(sid)
    img_rows = [x for x in rows if '"type":"image"' in x["raw"].replace(" ", "")]
    assert len(img_rows) == 2, [x["seq"] for x in img_rows]
    for x, (_, w, h_) in zip(img_rows, sizes):
        want = patches(*fit(w, h_))
        assert want * 0.9 <= x["tokens"] <= want * 1.2 + 100, (x["seq"], x["tokens"], w, h_, want)
        assert x["tokens"] < len(x["raw"]) / 12, "estimated by its bytes"
    ac.check_gauge_follows_usage(st.ledger, sid)
    # Transcripts: a placeholder with the size and estimated tokens, never the data.
    tdir = st.data / "sessions" / sid / "transcript"
    text = "\n".join(f.read_text() for f in sorted(tdir.glob("*.md")))
    for ty, w, h_ in sizes:
        assert f"*[image: {ty} · {w}×{h_} · ~" in text, (ty, w, h_)
    assert "iVBORw0KGgo" not in text

    if os.environ.get("OCEANCODE_BLESS"):
        save_capture(with_images[0])


def fit(w: int, h_: int) -> tuple[int, int]:
    """Anthropic's resize for large images: long edge <= 1568, <= 1568 patches."""
    s = min(1.0, 1568 / max(w, h_))
    while patches(int(w * s), int(h_ * s)) > 1568:
        s *= 0.995
    return int(w * s), int(h_ * s)


def save_capture(q: dict) -> None:
    CAPTURE.mkdir(parents=True, exist_ok=True)
    for old in CAPTURE.iterdir():
        old.unlink()
    stem = CAPTURE / "001_POST_v1_messages"
    Path(f"{stem}.body").write_text(q["body"])
    headers = [[k, v] for k, v in q["headers"].items() if k in (
        "content-type", "user-agent", "x-claude-code-session-id", "anthropic-beta", "anthropic-version")]
    meta = {"path": q["path"], "status": q["status"], "headers": headers}
    Path(f"{stem}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
