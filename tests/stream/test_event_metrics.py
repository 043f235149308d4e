"""The self metrics the Go agent has, with its label sets, read from a running agent's ``/metrics`` (and checked by
``promtool`` where it is installed): ``nodevitals_events_total{node,tier,device,condition,severity,phase,xid}`` and
``nodevitals_delivery_dropped_total{sink}``, here with real spool overflow on webhook endpoints that nobody answers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from nvdaemon.gpu.events import xid_event
from nvdaemon.nvml import GpuIdentity, XidNotice
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from tests.stream.harness import free_port, make_event, running

EVENT_LABELS = {"node", "tier", "device", "condition", "severity", "phase", "xid"}


def rows(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == family]
    assert fam.type == "counter"
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name == family + "_total"}


async def test_events_and_drops_carry_the_go_labels(tmp_path: Path) -> None:
    port = free_port()  # nothing listens: every delivery is refused, so the spool overflows
    hooks = (
        f"webhook: [{{url: 'http://user:pa55@127.0.0.1:{port}/a?token=do-not-show', allowInsecure: true}},"
        f" {{url: 'http://127.0.0.1:{port}/b'}}, {{url: 'http://localhost:{port}/c'}}]"
    )
    async with running(tmp_path, sinks=hooks, extra="spool: {maxEvents: 2}\n") as srv:
        agent = srv.agent
        webhooks = [s for s in agent.sinks.values() if isinstance(s, WebhookEndpoint)]
        assert len(webhooks) == 3
        ident = GpuIdentity(index=3, uuid="GPU-3", pci_bus_id="00000000:5D:00.0")
        xid = xid_event(XidNotice(3, 79), ident, node="n1", seq=6, now=1_700_000_100.0)
        agent.emit([make_event(i) for i in range(1, 6)] + [xid])
        with trio.fail_after(20):
            while sum(sum(s.dropped.values()) for s in webhooks) < 12:  # 6 events, 2 kept per endpoint
                await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
            body = (await http.get("/metrics")).text
    assert sum(sum(s.dropped.values()) for s in webhooks) == 12

    events = rows(body, "nodevitals_events")
    assert all({k for k, _ in key} == EVENT_LABELS for key in events)
    rule = (("condition", "load_high"), ("device", "cpu"), ("node", "n1"), ("phase", "ENTER"))
    assert events[(*rule, ("severity", "warning"), ("tier", "core"), ("xid", ""))] == 5.0
    gpu = (("condition", "gpu_xid_error"), ("device", "gpu3"), ("node", "n1"), ("phase", "ENTER"))
    assert events[(*gpu, ("severity", "critical"), ("tier", "gpu"), ("xid", "79"))] == 1.0

    dropped = rows(body, "nodevitals_delivery_dropped")
    # Go's names: scheme and host[:port]; path, query and credentials cut; endpoints on one host share a row.
    assert dropped == {
        (("sink", f"webhook:http://127.0.0.1:{port}"),): 8.0,
        (("sink", f"webhook:http://localhost:{port}"),): 4.0,
        (("sink", "stream"),): 0.0,
    }
    assert "pa55" not in body and "do-not-show" not in body and "/a?" not in body
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True, check=False)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
