"""The renderers that keep each series' line from one render to the next (the node_* surface's ``SeriesRenderer``,
the ``nodevitals_hw_*`` and collector status ``SeriesLines``) write what a fresh render writes, tick after tick, as
series come, go, move, repeat and change value (0 and -0 included), and keep only the previous render's series."""

from __future__ import annotations

import math
import random
from pathlib import Path

from nvdaemon.compat.node_exporter.family import SUFFIX, Family, SeriesRenderer, render
from nvdaemon.compat.node_exporter.surface import NodeResult
from nvdaemon.model import CollectorStatus, Kind, Sample, TierSnapshot, make_labels
from nvdaemon.server.metrics import MetricsCache, SeriesLines, hw_families, status_lines
from tests.server.fakeview import make_view

# Values whose spelling is special: zeros of both signs, NaN, the infinities, exponent forms, big integers.
VALUES = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-05, 123456.0, 1e6, 16647749632.0, 2.0**53 + 2, math.nan, math.inf, -math.inf)


def families(rng: random.Random) -> dict[str, Family]:
    """A node_* page whose series, their order, duplicates and values differ from one call to the next."""
    out: dict[str, Family] = {}
    for i in range(6):
        kind = ("gauge", "counter", "untyped", "summary", "histogram", "gauge")[i]
        help_text = "h" if rng.random() < 0.8 else "h\\other"  # HELP that changes now and then
        fam = Family(f"node_f{i}", help_text, kind)  # type: ignore[arg-type]
        for dev in rng.sample(["a", "b", "c", 'q"uote', "x\\y"], rng.randint(0, 5)):  # series that come and go
            labels = {"device": dev}
            if kind in ("summary", "histogram"):
                fam.add_suffixed(rng.choice(["_sum", "_count"]), rng.choice(VALUES), labels)
            fam.add(rng.choice(VALUES), labels)
            if rng.random() < 0.2:
                fam.add(rng.choice(VALUES), labels)  # a duplicate series: the first is kept
        if rng.random() < 0.3:
            fam.samples.reverse()  # input out of order
        if i == 5 and rng.random() < 0.5:  # a gauge's series with SUFFIX: moved to the name only with the flag
            if rng.random() < 0.5:
                fam.add_suffixed("_x", 1.0, {"device": "a"})
            else:
                fam.samples.append((((SUFFIX, "_x"), ("device", "a")), 1.0))  # as a textfile's copied samples
        out[fam.name] = fam
    return out


def test_series_renderer_writes_what_a_fresh_render_writes_tick_after_tick() -> None:
    rng = random.Random(31)
    kept = SeriesRenderer()
    for _ in range(400):
        page = families(rng)
        assert kept.render(page) == render(page)
        assert len(kept) == len(render(page).decode().splitlines()) - 2 * page_families(page)


def again(page: dict[str, Family], rng: random.Random) -> dict[str, Family]:
    """The same page as a new tick parses it (new tuples, new floats), some families changed: a zero's sign, one
    value, the HELP, the order, a NaN (never equal to itself), or nothing at all."""
    out: dict[str, Family] = {}
    for name, fam in page.items():
        samples = [(tuple((k, "".join(v)) for k, v in labels), float(str(value))) for labels, value in fam.samples]
        change = rng.choice(["none", "none", "none", "sign", "value", "help", "order", "nan"])
        help_text = fam.help + "!" if change == "help" else fam.help
        if samples and change == "sign":
            i = rng.randrange(len(samples))
            samples[i] = (samples[i][0], -samples[i][1] if samples[i][1] == 0 else samples[i][1])
        elif samples and change == "value":
            i = rng.randrange(len(samples))
            samples[i] = (samples[i][0], rng.choice(VALUES))
        elif change == "order":
            samples.reverse()
        elif samples and change == "nan":
            samples[0] = (samples[0][0], math.nan)
        out[name] = Family(name, help_text, fam.type, samples, fam.suffixed)
    return out


def test_a_family_unchanged_since_the_last_render_reads_as_a_fresh_render() -> None:
    rng = random.Random(5)
    kept = SeriesRenderer()
    page = families(rng)
    for i in range(600):
        page = again(page, rng) if i % 7 else families(rng)
        assert kept.render(page) == render(page)


def test_zero_signs_flip_while_every_sample_compares_equal() -> None:
    kept = SeriesRenderer()
    spelled = []
    for a, b in ((0.0, -0.0), (0.0, -0.0), (-0.0, 0.0), (-0.0, -0.0), (0.0, 0.0)):
        fam = Family("node_x", "x").add(1.0, device="a").add(a, device="b").add(b, device="c")
        spelled.append(kept.render({"node_x": fam}).decode().splitlines()[2:])
    assert spelled == [
        ['node_x{device="a"} 1', 'node_x{device="b"} 0', 'node_x{device="c"} -0'],
        ['node_x{device="a"} 1', 'node_x{device="b"} 0', 'node_x{device="c"} -0'],
        ['node_x{device="a"} 1', 'node_x{device="b"} -0', 'node_x{device="c"} 0'],
        ['node_x{device="a"} 1', 'node_x{device="b"} -0', 'node_x{device="c"} -0'],
        ['node_x{device="a"} 1', 'node_x{device="b"} 0', 'node_x{device="c"} 0'],
    ]


def page_families(page: dict[str, Family]) -> int:
    return sum(1 for fam in page.values() if fam.samples)


def test_zero_then_minus_zero_then_zero_again() -> None:
    kept = SeriesRenderer()
    spelled = []
    for value in (0.0, -0.0, -0.0, 0.0, 1e6, 1e6, 0.5):
        fam = Family("node_x", "x").add(value, device="a")
        spelled.append(kept.render({"node_x": fam}).decode().splitlines()[-1])
    assert spelled == [
        'node_x{device="a"} 0',
        'node_x{device="a"} -0',
        'node_x{device="a"} -0',
        'node_x{device="a"} 0',
        'node_x{device="a"} 1e+06',
        'node_x{device="a"} 1e+06',
        'node_x{device="a"} 0.5',
    ]


def test_series_that_went_are_forgotten() -> None:
    kept = SeriesRenderer()
    veths = Family("node_network_up", "up")
    for i in range(100):
        veths.add(1.0, device=f"veth{i}")
    kept.render({"node_network_up": veths})
    assert len(kept) == 100
    kept.render({"node_network_up": Family("node_network_up", "up").add(1.0, device="eth0")})
    assert len(kept) == 1
    kept.render({"node_load1": Family("node_load1", "load").add(0.5)})  # the family went: its table with it
    assert len(kept) == 1


def hw_samples(rng: random.Random) -> list[Sample]:
    out = []
    for dev in rng.sample(["nvme0", "nvme1", "sda", "eth0", 'odd"dev'], rng.randint(1, 5)):
        out.append(Sample("temp_celsius", dev, rng.choice(VALUES)))
        labels = make_labels({"share": rng.choice(["some", "full"])})
        out.append(Sample("psi_stall_seconds_total", dev, rng.choice(VALUES), Kind.COUNTER, labels))
        if rng.random() < 0.3:  # another label set under the family's first label names: cut or padded
            other = make_labels({"share": "some", "extra": "e"}) if rng.random() < 0.5 else ()
            out.append(Sample("psi_stall_seconds_total", dev, rng.choice(VALUES), Kind.COUNTER, other))
    rng.shuffle(out)
    return out


def test_hw_and_status_lines_with_memo_are_the_fresh_lines() -> None:
    rng = random.Random(7)
    hw, statuses = SeriesLines(), SeriesLines()
    for i in range(300):
        samples = hw_samples(rng)
        node = rng.choice(["n1", "n2"])  # a reload may rename the node
        with_memo = hw_families(node, "core", samples, memo=hw)
        fresh = hw_families(node, "core", samples)
        assert {m: f.lines for m, f in with_memo.items()} == {m: f.lines for m, f in fresh.items()}
        assert len(hw) == len({(s.metric, s.device, s.labels) for s in samples})
        collectors = {
            c: CollectorStatus(c, success=rng.random() < 0.5, duration=rng.choice(VALUES), samples=1, error_total=i)
            for c in rng.sample(["cpu", "hwmon", "netdev", "rapl"], rng.randint(1, 4))
        }
        snap = TierSnapshot("core", (), collectors, collected_at=float(i), duration=0.1)
        assert status_lines(snap, statuses) == status_lines(snap)
        assert len(statuses) == 4 * len(collectors)


def without_process(body: bytes) -> str:
    return "".join(line + "\n" for line in body.decode().splitlines() if not line.startswith("process_"))


def test_long_lived_cache_page_is_a_fresh_caches_page(tmp_path: Path) -> None:
    view = make_view(tmp_path, "nodeExporter: {enabled: true}\n")
    cache = MetricsCache(view)
    rng = random.Random(3)
    for i in range(60):
        statuses = {"node_exporter.x": CollectorStatus("node_exporter.x", success=True, duration=0.001 * i)}
        result = NodeResult((), families=tuple(families(rng).values()), success=True)
        view.take(TierSnapshot("core", hw_samples(rng), statuses, 100.0 + i, 0.25, results={"node_exporter.x": result}))
        page = without_process(cache.render())
        assert page == without_process(MetricsCache(view).render())
        assert "node_scrape_collector_success" in page
        if i % 10 == 9:  # the node_* surface switched off and on again
            view.update(loaded=make_view(tmp_path).loaded)
            view.update(reloads=view.reloads + 1)
            assert "node_scrape_collector_success" not in without_process(cache.render())
            view.update(loaded=make_view(tmp_path, "nodeExporter: {enabled: true}\n").loaded)
            view.update(reloads=view.reloads + 1)
