"""gzip for ``/metrics``: whether a request accepts it (its ``Accept-Encoding``, parsed by werkzeug as quart's
``request.accept_encodings`` is), and the gzip of the current page, made at most once per page.

Prometheus sends ``Accept-Encoding: gzip`` on every scrape and node_exporter answers gzipped; the page changes only
when a tier ticks (``MetricsCache``), so the compression is paid once per changed page, by the first scrape that
asks for gzip after the change, and every other scrape gets the same compressed bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from isal import isal_zlib
from werkzeug.datastructures import Accept
from werkzeug.http import parse_accept_header

# Intel's ISA-L (python-isal), level 1, not zlib. The page is compressed once per tick, so its CPU counts on every
# node. One compression of the gpunode page with the node_exporter surface on (161,078 bytes; median of 60, this
# 2-CPU VM): ISA-L level 1 gave 26,633 bytes in 0.092 ms; zlib level 5 (used until then) 23,684 bytes in 1.1 ms
# (1.36 ms with the caches cold, as after a tick), level 1 27,718 bytes in 0.54 ms, level 6 23,461 bytes in 1.6 ms;
# zlib-ng level 5 23,507 bytes in 0.73 ms. So 12 % more bytes than zlib level 5 (2.9 KB a scrape, about 200 bytes a
# second at 15 s) for a twelfth of the CPU; node_exporter's own gzip (Go, level 6) sends 18 KB for its smaller page.
# ISA-L's level 2 (its default) saves 0.4 % of the bytes and takes 112 KiB more memory while it compresses (peak
# RSS, 276 against 388 KiB; zlib level 5: 384 KiB). The stream is plain gzip (RFC 1952): every client reads it.
LEVEL = 1
_GZIP_WBITS = 16 + 15  # a gzip header and trailer around a 32 KiB-window deflate stream; header mtime 0


def accept_encodings(values: Iterable[str]) -> Accept:
    """The request's ``Accept-Encoding`` header lines (several are one list, RFC 9110 5.3), parsed by werkzeug into
    what quart's ``request.accept_encodings`` gives; that property reads only the first line, so a HEAD through
    quart and a GET in front of it would disagree on ``deflate`` then ``gzip`` in two lines."""
    return parse_accept_header(", ".join(values) or None, Accept)


def accepts_gzip(accepted: Accept) -> bool:
    """Whether to answer gzip: the client gives it a quality above 0 (``gzip;q=0`` refuses it, ``*`` counts) and no
    lower than identity's. An absent header, ``identity`` alone, or ``gzip;q=0.5, *`` get identity."""
    q = accepted.quality("gzip")
    return q > 0 and q >= accepted.quality("identity")


class GzipBody:
    """The gzip of the latest body it was given: compressed again only when the body is another object (the
    metrics cache hands out the same bytes object until the page changes). ``compressions`` counts compressions.
    The output has no timestamp or name (mtime 0), so identical pages give identical bytes."""

    def __init__(self) -> None:
        self._source: bytes | None = None
        self._compressed = b""
        self.compressions = 0

    def of(self, body: bytes) -> bytes:
        if body is not self._source:
            self._compressed = isal_zlib.compress(body, LEVEL, _GZIP_WBITS)
            self._source = body
            self.compressions += 1
        return self._compressed
