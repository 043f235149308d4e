"""The check both committed gRPC stub sets share: regenerating them with ``make proto``'s command changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def assert_stubs_fresh(proto: str, tmp_path: Path) -> None:
    """``nvdaemon/proto/<proto>.proto`` compiled as the Makefile does, into ``tmp_path``, equals what is committed."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Invdaemon/proto=protos",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        f"nvdaemon/proto/{proto}.proto",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    for name in (f"{proto}_pb2.py", f"{proto}_pb2.pyi", f"{proto}_pb2_grpc.py"):
        fresh = (tmp_path / "nvdaemon" / "proto" / name).read_bytes()
        committed = (ROOT / "nvdaemon" / "proto" / name).read_bytes()
        assert fresh == committed, f"nvdaemon/proto/{name} is stale: run `make proto`"
    makefile = (ROOT / "Makefile").read_text()
    assert "-Invdaemon/proto=protos --python_out=. --pyi_out=. --grpc_python_out=." in makefile
    assert f"nvdaemon/proto/{proto}.proto" in makefile
