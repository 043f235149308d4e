"""``/metrics`` answers gzip when the request's ``Accept-Encoding`` allows it (q-values honoured), identity otherwise,
with ``Vary: Accept-Encoding`` on both; GET (answered in front of quart) and HEAD (through quart) agree; the page is
compressed once per change of the page, not once per scrape. Over a real server on loopback and a raw HTTP client."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import trio
from isal import isal_zlib

from nvdaemon.server.metrics import MetricsCache
from tests.server.fakeview import FakeView, make_view
from tests.server.raw import Conn, make_server_view, serving
from tests.server.test_metrics_render import SURFACES, stable, tick

# Accept-Encoding header lines (none: no header) -> whether the answer is gzipped.
TABLE: list[tuple[tuple[str, ...], bool]] = [
    ((), False),
    (("gzip",), True),  # what Prometheus sends
    (("GZIP",), True),
    (("gzip, deflate, br",), True),
    (("deflate",), False),
    (("identity",), False),
    (("gzip;q=0",), False),
    (("gzip;q=0, *",), False),  # the named coding wins over the wildcard
    (("*",), True),
    (("*;q=0.5",), True),
    (("identity, gzip;q=0.5",), False),  # identity preferred
    (("gzip;q=0.5, *",), False),  # identity, through *, preferred
    (("gzip;q=0.8, identity;q=0.2",), True),
    (("identity;q=0, gzip",), True),
    (("deflate", "gzip"), True),  # two header lines are one list
]


def head_of(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = reply.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    return (
        int(status_line.split()[1]),
        {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)},
        rest,
    )


async def head_request(host: str, port: int, header_lines: str) -> tuple[int, dict[str, str], bytes]:
    conn = await Conn.open(host, port)
    await conn.send(f"HEAD /metrics HTTP/1.1\r\nHost: x\r\n{header_lines}Connection: close\r\n\r\n".encode())
    with trio.fail_after(10):
        return head_of(await conn.closed_by_server())


async def test_accept_encoding_table_get_and_head(tmp_path: Path) -> None:
    view = make_server_view(tmp_path, extra=SURFACES)
    tick(view, "core", 3.5, at=100.0)
    wrong: list[str] = []
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        _, _, plain = await conn.get("/metrics")
        for lines, gzipped in TABLE:
            header_lines = "".join(f"Accept-Encoding: {v}\r\n" for v in lines)
            status, headers, body = await conn.get("/metrics", header_lines)
            h_status, h_headers, h_rest = await head_request(host, port, header_lines)
            got = headers.get("content-encoding")
            if status != 200 or got != ("gzip" if gzipped else None):
                wrong.append(f"GET {lines}: {status} content-encoding {got!r}")
            if h_status != 200 or h_headers.get("content-encoding") != got or h_rest:
                wrong.append(f"HEAD {lines}: {h_status} {h_headers} body {h_rest[:20]!r}")
            for what, hs in (("GET", headers), ("HEAD", h_headers)):
                if hs.get("vary", "").lower() != "accept-encoding":
                    wrong.append(f"{what} {lines}: vary {hs.get('vary')!r}")
                if hs.get("content-type") != "text/plain; version=0.0.4; charset=utf-8":
                    wrong.append(f"{what} {lines}: content-type {hs.get('content-type')!r}")
            # Content-Length is the length on the wire (the compressed one), for HEAD as for GET.
            if int(headers["content-length"]) != len(body) or int(h_headers["content-length"]) != len(body):
                wrong.append(
                    f"{lines}: content-length GET {headers['content-length']} HEAD "
                    f"{h_headers['content-length']}, body {len(body)}"
                )
            if (gzip.decompress(body) if got == "gzip" else body) != plain:
                wrong.append(f"{lines}: the page differs from the identity page")
    assert not wrong, "\n".join(wrong)


async def test_unchanged_page_is_compressed_once_across_scrapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five gzip scrapes of an unchanged page compress it once and send the same bytes; after a tick, once more."""
    calls: list[int] = []
    real = isal_zlib.compress

    def counting(data: bytes, *args: int) -> bytes:
        calls.append(len(data))
        return real(data, *args)

    monkeypatch.setattr(isal_zlib, "compress", counting)
    view = make_server_view(tmp_path, extra=SURFACES)
    tick(view, "core", 3.5, at=100.0)
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        _, _, plain = await conn.get("/metrics")  # identity: nothing compressed
        assert calls == []
        answers = [await conn.get("/metrics", "Accept-Encoding: gzip\r\n") for _ in range(5)]
        assert all(h.get("content-encoding") == "gzip" for _, h, _ in answers)
        assert len({body for _, _, body in answers}) == 1 and calls == [len(plain)]
        assert gzip.decompress(answers[0][2]) == plain
        tick(view, "core", 7.25, at=110.0)
        _, headers, body = await conn.get("/metrics", "Accept-Encoding: gzip\r\n")
        again = await conn.get("/metrics", "Accept-Encoding: gzip\r\n")
    assert len(calls) == 2 and again[2] == body != answers[0][2] and headers["content-encoding"] == "gzip"
    assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 7.25\n' in gzip.decompress(body).decode()


def three_tier_cache(tmp_path: Path) -> tuple[FakeView, MetricsCache]:
    view = make_view(tmp_path, f"tiers: [core, gpu, smart]\n{SURFACES}")
    for tier in ("core", "gpu", "smart"):
        tick(view, tier, 1.0, at=100.0)
    return view, MetricsCache(view)


def test_cache_compresses_once_per_page_version(tmp_path: Path) -> None:
    gz: list[str] = ["gzip"]  # the request's Accept-Encoding lines
    plain: list[str] = []
    view, cache = three_tier_cache(tmp_path)
    for _ in range(3):
        cache.answer(plain)
    assert cache.compressions == 0  # identity scrapes never compress
    bodies = [cache.answer(gz)[1] for _ in range(10)]
    assert cache.compressions == 1 and all(b is bodies[0] for b in bodies)
    assert gzip.decompress(bodies[0]) == cache.answer(plain)[1]
    tick(view, "gpu", 2.0, at=110.0)
    headers, body = cache.answer(gz)
    assert cache.compressions == 2 and (b"content-encoding", b"gzip") in headers
    assert stable(gzip.decompress(body)) == stable(MetricsCache(view).render())


def test_gzip_is_deterministic() -> None:
    """No timestamp or file name in the gzip header: identical pages give identical bytes."""
    from nvdaemon.server.gzip_body import GzipBody  # here, so the HTTP tests above run (and fail) without it

    page = b"# TYPE x gauge\nx 1\n" * 1000
    one, two = GzipBody().of(page), GzipBody().of(bytes(bytearray(page)))
    assert one == two and one[4:8] == b"\0\0\0\0" and not one[3] & 0x08  # MTIME 0, no FNAME
    assert gzip.decompress(one) == page
