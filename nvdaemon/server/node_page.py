"""``GET /``: the node page, one HTML document for people (``nvdaemon/server/page/``), and the websocket rules it
relies on.

The page is static: it holds no data of the node and no secret, so ``/`` is open like ``/metrics``; everything it
shows it reads from ``/v1/status``, ``/v1/events`` and ``/v1/history`` in the browser, under the same token rule as
any other client (``server.apiTokenFile``). Its stylesheet and script are put inline when the page is first asked
for, and the ``Content-Security-Policy`` allows exactly those two by their SHA-256 and nothing else: no other
script, style, image, font, frame or form target, and connections to the agent's own origin only. Until ``/`` is
requested nothing of it is read or held; afterwards the assembled page (about 26 KB, and its 9 KB gzip) is kept.

A browser cannot put an ``Authorization`` header on a websocket upgrade; the page sends the token as a subprotocol
instead, the rule of ``nvdaemon/server/token.py`` for every websocket client.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from functools import cache
from importlib import resources

from quart import Response, request
from quart_trio import QuartTrio

from nvdaemon.server.gzip_body import accept_encodings, accepts_gzip

PAGE_DIR = "server/page"


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


class NodePage:
    """The assembled page: ``body`` (HTML with the stylesheet and script inline), its ``gzip`` and ``csp``."""

    def __init__(self, html: str, css: str, js: str) -> None:
        # The markers are replaced whole; the hashes are of the exact text between the tags.
        body = html.replace("/*STYLE*/", css).replace("/*SCRIPT*/", js)
        self.body = body.encode()
        self.gzip = gzip.compress(self.body, mtime=0)
        self.csp = "; ".join(
            (
                "default-src 'none'",
                f"script-src {_digest(js)}",
                f"style-src {_digest(css)}",
                "connect-src 'self'",
                "img-src 'none'",
                "base-uri 'none'",
                "form-action 'none'",
                "frame-ancestors 'none'",
            )
        )

    def headers(self, gzipped: bool) -> dict[str, str]:
        out = {
            "Content-Type": "text/html; charset=utf-8",
            "Content-Security-Policy": self.csp,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
            "Cache-Control": "no-cache",
            "Vary": "Accept-Encoding",
        }
        if gzipped:
            out["Content-Encoding"] = "gzip"
        return out


@cache
def node_page() -> NodePage:
    """The page, read from the package on first use (``page/node.html``, ``node.css``, ``node.js``). Those reads
    block the event loop once, for three small files of the installed package; every later request is served from
    memory."""
    root = resources.files("nvdaemon").joinpath(PAGE_DIR)
    html, css, js = (root.joinpath(name).read_text(encoding="utf-8") for name in ("node.html", "node.css", "node.js"))
    return NodePage(html, css, js)


def register(app: QuartTrio) -> None:
    @app.route("/", methods=["GET", "HEAD"])
    async def index() -> Response:
        page = node_page()
        gzipped = accepts_gzip(accept_encodings(request.headers.getlist("Accept-Encoding")))
        return Response(page.gzip if gzipped else page.body, headers=page.headers(gzipped))
