"""``LabelSets``: the label pairs ``Family.add`` makes are the tuples an earlier cycle made for the same labels, so
that what a tick leaves alive for the garbage collector's walk holds no new ones; sets no cycle meets are
forgotten, and a table that is never rotated stays bounded."""

from __future__ import annotations

import pytest

from nvdaemon.compat.node_exporter.family import Family, LabelSets, SeriesRenderer, render


class Cycle:
    """Stands for a cycle's read cache: only its identity counts (held weakly)."""


def pairs(device: str, sensor: str = "temp1") -> tuple[tuple[str, str], ...]:
    # Built from parts, so that equal tuples are never the same object by chance.
    return (("chip", "".join(["plat", device])), ("sensor", "".join([sensor[:2], sensor[2:]])))


def test_an_equal_label_set_is_answered_with_the_first_one_met() -> None:
    sets = LabelSets()
    first = sets.canonical(pairs("a"))
    again = pairs("a")
    assert again == first and again is not first
    assert sets.canonical(again) is first
    assert sets.canonical(pairs("b")) is not first


def test_families_of_two_ticks_share_their_label_tuples() -> None:
    one = Family("node_hwmon_temp_celsius", "h").add(45.0, {"chip": "platform_coretemp_0", "sensor": "temp1"})
    two = Family("node_hwmon_temp_celsius", "h").add(46.0, {"sensor": "temp1", "chip": "platform_coretemp_0"})
    assert one.samples[0][0] is two.samples[0][0]
    assert one.samples[0][0] == (("chip", "platform_coretemp_0"), ("sensor", "temp1"))
    assert render({"f": two}) == SeriesRenderer().render({"f": two})


def test_a_set_met_every_cycle_is_kept_and_one_no_cycle_met_is_forgotten() -> None:
    sets = LabelSets()
    cycles = [Cycle() for _ in range(6)]
    sets.cycle(cycles[0])
    kept, gone = sets.canonical(pairs("a")), sets.canonical(pairs("veth0"))
    for cycle in cycles[1:]:
        sets.cycle(cycle)
        assert sets.canonical(pairs("a")) is kept
    assert len(sets) == 1  # veth0 went with the generation after the one that last met it
    assert sets.canonical(pairs("veth0")) is not gone


def test_the_same_cycle_or_none_does_not_rotate() -> None:
    sets = LabelSets()
    cycle = Cycle()
    sets.cycle(cycle)
    first = sets.canonical(pairs("a"))
    for _ in range(3):
        sets.cycle(cycle)
        sets.cycle(None)
    assert sets.canonical(pairs("a")) is first  # three rotations without meeting it would have forgotten it
    sets.cycle(Cycle())
    sets.cycle(Cycle())  # two rotations with nothing met: forgotten only now
    assert sets.canonical(pairs("a")) is not first


def test_a_table_never_rotated_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = LabelSets()
    monkeypatch.setattr(LabelSets, "LIMIT", 16)
    for i in range(1000):
        sets.canonical(pairs(f"dev{i}"))
        assert len(sets) <= 2 * 16
