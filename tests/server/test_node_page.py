"""``GET /``, the node page, from the server's side (the page in a browser: tests/browser/test_node_page.py).

The page is open when ``server.apiTokenFile`` is set (it holds no data), its Content-Security-Policy allows exactly
its own inline stylesheet and script by hash, HEAD and gzip answer as for /metrics, and the websocket accepts the
token a browser can send there: the ``nvdaemon.bearer.<base64url>`` subprotocol, checked like the header.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import httpx
import pytest
import trio_websocket

from nvdaemon.server.token import bearer_from_subprotocols, chosen_subprotocol
from tests.stream.harness import make_event, receive, running

TOKEN = "s3cret-token"


def b64url(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def directives(csp: str) -> dict[str, list[str]]:
    out = {}
    for part in csp.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def inline(tag: str, html: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)


async def test_the_page_allows_only_its_own_inline_code_and_reads_only_its_origin(tmp_path: Path) -> None:
    async with running(tmp_path) as srv, httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
        r = await http.get("/", headers={"Accept-Encoding": "identity"})
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "content-encoding" not in r.headers
        csp = directives(r.headers["content-security-policy"])
        (script,), (style,) = inline("script", r.text), inline("style", r.text)
        assert len(script) > 1000 and len(style) > 500  # the real code, put inline
        assert csp["default-src"] == ["'none'"]
        assert csp["script-src"] == [sha256_source(script)]
        assert csp["style-src"] == [sha256_source(style)]
        assert csp["connect-src"] == ["'self'"]
        for name in ("base-uri", "form-action", "frame-ancestors", "img-src"):
            assert csp[name] == ["'none'"], name
        assert "unsafe" not in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        # Nothing is loaded from elsewhere: no src= or href= but the agent's own paths.
        assert re.findall(r'(?:src|href)="([^"]*)"', r.text) == ["/metrics", "/healthz", "/readyz"]
        assert "innerHTML" not in script and "eval(" not in script  # agent text never parsed as HTML or code

        zipped = await http.get("/", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        assert int(zipped.headers["content-length"]) < len(r.content) / 2
        assert zipped.content == r.content  # httpx decodes: the same page

        head = await http.head("/", headers={"Accept-Encoding": "identity"})
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-security-policy"] == r.headers["content-security-policy"]
        assert int(head.headers["content-length"]) == len(r.content)


async def test_the_page_is_open_under_a_token_and_the_api_is_not(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    async with (
        running(tmp_path, extra=f"server: {{apiTokenFile: {token}}}\n") as srv,
        httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http,
    ):
        page = await http.get("/")
        assert page.status_code == 200 and TOKEN not in page.text
        assert (await http.get("/v1/status")).status_code == 401
        assert (await http.get("/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200


async def test_a_browser_websocket_sends_its_token_as_a_subprotocol(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    async with running(tmp_path, extra=f"server: {{apiTokenFile: {token}}}\n") as srv:
        await srv.publish([make_event(0)])

        def connect(protocols: list[str], headers: list[tuple[bytes, bytes]] | None = None) -> object:
            return trio_websocket.open_websocket(
                srv.host, srv.port, "/v1/events?replay=1", use_ssl=False, subprotocols=protocols, extra_headers=headers
            )

        async with connect(["nvdaemon.events", "nvdaemon.bearer." + b64url(TOKEN)]) as ws:  # type: ignore[attr-defined]
            assert ws.subprotocol == "nvdaemon.events"  # the token is never echoed back
            assert (await receive(ws, 1))[0]["data"]["seq"] == 0

        refused: list[tuple[list[str], list[tuple[bytes, bytes]] | None]] = [
            (["nvdaemon.events", "nvdaemon.bearer." + b64url("wrong")], None),
            (["nvdaemon.events", "nvdaemon.bearer.!!not-base64!!"], None),
            (["nvdaemon.events"], None),
            # A header, when there is one, is what is checked: a wrong one is not rescued by the subprotocol.
            (["nvdaemon.events", "nvdaemon.bearer." + b64url(TOKEN)], [(b"authorization", b"Bearer wrong")]),
        ]
        for protocols, headers in refused:
            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with connect(protocols, headers):  # type: ignore[attr-defined]
                    pass
            assert rejected.value.status_code == 401, protocols
            assert TOKEN.encode() not in (rejected.value.body or b"")
        assert srv.hub.clients == set()


async def test_clients_that_offer_no_subprotocol_get_none(tmp_path: Path) -> None:
    async with running(tmp_path) as srv:
        await srv.publish([make_event(3)])
        async with srv.connect(replay=1) as ws:  # nodevitals' own clients and `nvdaemon tail`
            assert ws.subprotocol is None
            assert (await receive(ws, 1))[0]["data"]["seq"] == 3


@pytest.mark.parametrize(
    ("offered", "token"),
    [
        ([], None),
        (["nvdaemon.events"], None),
        (["nvdaemon.bearer." + b64url(TOKEN)], TOKEN),
        (["x", "nvdaemon.bearer." + b64url("ünï/+=")], "ünï/+="),
        (["nvdaemon.bearer.%%%"], None),
        (["nvdaemon.bearer." + b64url(TOKEN) + "="], TOKEN),  # padding given or not
        (["nvdaemon.bearer." + base64.urlsafe_b64encode(b"\xff\xfe").decode()], None),  # not UTF-8
    ],
)
def test_bearer_from_subprotocols(offered: list[str], token: str | None) -> None:
    assert bearer_from_subprotocols(offered) == token


def test_chosen_subprotocol() -> None:
    assert chosen_subprotocol(["nvdaemon.bearer.eA", "nvdaemon.events"]) == "nvdaemon.events"
    assert chosen_subprotocol(["nvdaemon.bearer.eA"]) is None
    assert chosen_subprotocol([]) is None
