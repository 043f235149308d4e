"""The soak's fixture host: a copy of ``fixtures/hosts/faulty`` (plus CLONES cloned PCI devices) whose files the
chaos changes, each in one atomic step."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from bench.common import copy_host

CLONES = 64  # cloned PCI devices: a correctable burst is 64 ENTERs, then 64 EXITs


def write_atomic(path: Path, text: str) -> None:
    """Replace a file in one step, so the agent never reads half of it."""
    tmp = path.with_name(f".{path.name}.soak")
    tmp.write_text(text)
    os.replace(tmp, path)


class Host:
    """A copy of fixtures/hosts/faulty under ``into`` (``into/host``), with a boot id; its files the soak changes."""

    def __init__(self, into: Path) -> None:
        self.root = root = copy_host("faulty", into)
        hwmon = root / "sys" / "class" / "hwmon"
        self.coretemp = next(p for p in hwmon.iterdir() if (p / "name").read_text().strip() == "coretemp")
        pci = root / "sys" / "bus" / "pci" / "devices"
        template = pci / "0000:3b:00.0"
        self.clones: list[Path] = []
        for i in range(CLONES):
            clone = pci / f"0000:81:{i:02x}.0"
            shutil.copytree(template, clone)
            self.clones.append(clone)
        self.fatal_devices = sorted(p for p in pci.iterdir() if (p / "aer_dev_fatal").exists())
        self.load_high = self.hot = self.pressure = True

    def set_load(self, high: bool) -> None:
        self.load_high = high
        write_atomic(self.root / "proc" / "loadavg", f"{'24.51' if high else '0.50'} 18.32 9.87 27/1310 223344\n")

    def set_hot(self, hot: bool) -> None:
        self.hot = hot
        write_atomic(self.coretemp / "temp1_input", "97000\n" if hot else "60000\n")

    def set_pressure(self, high: bool) -> None:
        self.pressure = high
        some = "35.12" if high else "1.05"
        write_atomic(
            self.root / "proc" / "pressure" / "memory",
            f"some avg10={some} avg60=28.40 avg300=12.07 total=987654321\n"
            "full avg10=21.55 avg60=17.80 avg300=7.43 total=654321098\n",
        )

    def bump(self, device: Path, kind: str) -> None:
        """One more AER error of ``kind`` (fatal, correctable) on ``device``: its TOTAL_ line goes up by one."""
        path = device / f"aer_dev_{kind}"
        text = path.read_text()
        total = re.search(r"^(TOTAL_ERR_\w+) (\d+)$", text, re.M)
        assert total is not None
        n = int(total.group(2)) + 1
        write_atomic(path, text[: total.start(2)] + str(n) + text[total.end(2) :])
