"""A real Prometheus (Debian's ``prometheus``) for the stack tests: started on a free loopback port with its own
config and data directory, scraping every second and evaluating rules every second; asked only through its HTTP
API (urllib to 127.0.0.1)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.polling import until_sync
from tests.test_e2e import free_port

# Prometheus's own counters of samples it refused from a scrape (all must stay 0).
REJECTION_COUNTERS = (
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
    "prometheus_target_scrapes_sample_out_of_order_total",
    "prometheus_target_scrapes_sample_out_of_bounds_total",
    "prometheus_target_scrapes_exceeded_sample_limit_total",
    "prometheus_target_scrapes_exceeded_body_size_limit_total",
    "prometheus_target_scrapes_exemplar_out_of_order_total",
    "prometheus_target_scrape_pool_exceeded_label_limits_total",
    "prometheus_target_scrape_pool_exceeded_target_limit_total",
)


# Gently: every call may be an HTTP query, and the machine is shared.
poll = functools.partial(until_sync, timeout=30.0, step=0.25)


def require_prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip(
            "prometheus not found (Debian package prometheus; make test installs it as root): stack tests not run"
        )
    return path


class Prometheus:
    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_groups: list[dict[str, Any]]) -> None:
        self.binary = require_prometheus()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        (self.dir / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(self.dir / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (self.dir / "prometheus.log").open("ab")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        cmd = [
            self.binary,
            f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, cwd=self.dir)
        try:
            poll(self._ready, "prometheus /-/ready", timeout=30)
        except BaseException:
            self.stop()  # `with` runs no __exit__ when __enter__ raises: never leave the server running
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log_text()}")
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def log_text(self) -> str:
        return (self.dir / "prometheus.log").read_text(errors="replace")[-4000:]

    # ---- HTTP API ------------------------------------------------------------------------------------------------
    def api(self, path: str, **params: str | float) -> Any:
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code} {exc.read()[:500]!r}") from exc
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the vector's elements, each ``{"metric": {...}, "value": [t, "v"]}``."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single value of an instant query (None when it returns nothing)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {len(result)} series"
        return float(result[0]["value"][1]) if result else None

    def alerts(self, state: str = "firing") -> set[str]:
        """Alert names in ALERTS with alertstate ``state``."""
        return {r["metric"]["alertname"] for r in self.query(f'ALERTS{{alertstate="{state}"}}')}

    def rule_evaluations(self) -> float:
        """How many rule group evaluations have run (from Prometheus's own /metrics)."""
        return sum(v for _, v in self.own_metrics("prometheus_rule_evaluations_total"))

    def own_metrics(self, name: str) -> list[tuple[str, float]]:
        """Prometheus's own exposition: (labels, value) of every sample of ``name``."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out = []
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                series, _, value = line.rpartition(" ")
                out.append((series.removeprefix(name), float(value)))
        return out

    def wait_alerts(self, names: set[str], state: str = "firing", timeout: float = 40.0) -> None:
        def seen() -> bool:
            return names <= self.alerts(state)

        try:
            poll(seen, f"alerts {sorted(names)} {state}", timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {state} now: {sorted(self.alerts(state))}") from None

    def wait_resolved(self, names: set[str], timeout: float = 40.0) -> None:
        """None of ``names`` is pending or firing any more."""

        def gone() -> bool:
            return not names & (self.alerts("firing") | self.alerts("pending"))

        try:
            poll(gone, f"alerts {sorted(names)} resolved", timeout=timeout)
        except AssertionError as exc:
            still = names & (self.alerts("firing") | self.alerts("pending"))
            raise AssertionError(f"{exc}; still active: {sorted(still)}") from None

    def wait_scrapes(self, n: int, job: str) -> None:
        """Until every target of ``job`` has been scraped ``n`` more times (counted on ``up``'s samples)."""
        expr = f'min(count_over_time(up{{job="{job}"}}[1h]))'
        first = self.value(expr) or 0.0
        poll(lambda: (self.value(expr) or 0.0) >= first + n, f"{n} scrapes of {job}", timeout=30)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def now() -> float:
        return time.time()
