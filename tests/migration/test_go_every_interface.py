"""Every interface, IPv4 and IPv6, as the Go chart's ``:9847`` listens: the chart renders ``listenAddr: ":PORT"``
unless ``metrics.bindAddress`` narrows it, and the agent run with that rendered config answers on the IPv4 and the
IPv6 loopback alike (on an IPv6-only or IPv6-first cluster, the kubelet probes and Prometheus scrapes the pod's
IPv6 address).

The agent is a real ``nvdaemon run`` with the core DaemonSet's config as the chart renders it, only its host roots
and state directory moved onto the fixture host and a temporary directory (a pod mounts them at /host and
/var/lib/nvdaemon).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdaemon.server.listen import ipv6_only_default
from tests.deploy.helm import Rendered, render
from tests.migration.test_go_release_names import go_file
from tests.test_e2e import ROOT, free_port, wait_for

HOST = ROOT / "fixtures" / "hosts" / "healthy"


def listen_addrs(r: Rendered) -> dict[str, str]:
    return {c: r.config_of(ds)[1]["sinks"]["metrics"]["listenAddr"] for c, ds in r.daemonsets().items()}


ALL_ON = {"tiers": {"core": {"enabled": True}, "smart": {"enabled": True}, "gpu": {"enabled": True}}}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, ":9847"),
        (go_file(), ":9847"),
        (go_file(**ALL_ON), ":9847"),
        (go_file(**ALL_ON, singlePod=True), ":9847"),
        ({"metrics": {"port": 9100}}, ":9100"),
        ({"metrics": {"bindAddress": "0.0.0.0"}}, "0.0.0.0:9847"),
        ({"metrics": {"bindAddress": "::"}}, "[::]:9847"),
        ({"metrics": {"bindAddress": "fd00::5"}}, "[fd00::5]:9847"),
        ({"metrics": {"bindAddress": "10.0.0.5"}}, "10.0.0.5:9847"),
    ],
)
def test_the_chart_listens_on_every_interface_unless_narrowed(values: dict[str, Any], expected: str) -> None:
    addrs = listen_addrs(render(values))
    assert addrs
    assert set(addrs.values()) == {expected}, addrs


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def ipv6_port_free(port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::", port))
    except OSError:
        return False
    return True


def test_the_rendered_config_answers_on_ipv4_and_ipv6(tmp_path: Path) -> None:
    if ipv6_only_default() is None:
        pytest.skip("no IPv6 on this host: only the IPv4 half of every interface could be checked")
    port = free_port()
    if not ipv6_port_free(port):
        pytest.skip(f"port {port} is free on IPv4 but taken on IPv6 here")
    r = render({"metrics": {"port": port}})
    _, config = r.config_of(r.daemonsets()["core"])
    assert config["sinks"]["metrics"]["listenAddr"] == f":{port}"
    config.update(
        node="dual-stack-node",
        procRoot=str(HOST / "proc"),
        sysRoot=str(HOST / "sys"),
        stateDir=str(tmp_path / "state"),
        intervalSeconds=0.5,
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvdaemon", "run", "--config", str(path)], stdout=log, stderr=log, cwd=ROOT
    )
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), "readyz 200 on the IPv4 loopback")
        wait_for(lambda: answers(f"http://[::1]:{port}/readyz"), "readyz 200 on the IPv6 loopback")
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as resp:
            assert b'nodevitals_hw_load1{device="cpu",node="dual-stack-node",tier="core"}' in resp.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
