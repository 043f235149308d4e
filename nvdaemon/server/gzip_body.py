"""gzip for ``/metrics``: whether a request accepts it (its ``Accept-Encoding``, parsed by werkzeug as quart's
``request.accept_encodings`` is), and the gzip of the current page, made at most once per page.

Prometheus sends ``Accept-Encoding: gzip`` on every scrape and node_exporter answers gzipped; the page changes only
when a tier ticks (``MetricsCache``), so the compression is paid once per changed page, by the first scrape that
asks for gzip after the change, and every other scrape gets the same compressed bytes.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable

from werkzeug.datastructures import Accept
from werkzeug.http import parse_accept_header

# Level 5. One compression of the gpunode fixture page with the node_exporter surface on (30 collectors, 159,599
# bytes): level 1 gave 27,297 bytes in 0.55 ms, level 6 (zlib's default) 23,063 bytes in 1.6 ms (level 9: 22,701
# bytes, 3.5 ms). The time is paid once per changed page (at most once per tick), the size on every scrape by every
# scraper, so level 1's 15 % more bytes are not worth its millisecond. Level 5 is the knee: on that page (158,303
# bytes) 23,002 bytes in 1.13 ms against level 6's 22,777 in 1.65 ms (level 4: 24,014 bytes, 0.87 ms; median of 60
# compressions): 1 % more bytes on the wire for a third less compression time, half a millisecond per tick.
LEVEL = 5


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
    The output has no timestamp or name (``mtime=0``), so identical pages give identical bytes."""

    def __init__(self) -> None:
        self._source: bytes | None = None
        self._compressed = b""
        self.compressions = 0

    def of(self, body: bytes) -> bytes:
        if body is not self._source:
            self._compressed = gzip.compress(body, compresslevel=LEVEL, mtime=0)
            self._source = body
            self.compressions += 1
        return self._compressed
