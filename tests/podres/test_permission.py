"""What the chart's privilege choice rests on, for real: a client as uid 65532 cannot connect to a root-owned
``srwxr-xr-x`` socket (counted as ``refused``, "Permission denied" in the log), and can once a group it has may write
the socket (``dcgmCompat.podResourcesGroup``). Needs root (to drop to another uid) and util-linux's setpriv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.podres.kubelet import TestKubelet, pod

ROOT = Path(__file__).resolve().parents[2]
CLIENT = """
import sys
from nvdaemon.gpu.podresources import PodResourcesClient, PodResourcesError
try:
    print(len(PodResourcesClient(sys.argv[1], 5).list_allocations()))
except PodResourcesError as exc:
    print(exc.reason, exc)
"""


@pytest.fixture
def kubelet() -> Iterator[TestKubelet]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run the client as another uid")
    with tempfile.TemporaryDirectory() as d:  # not tmp_path: pytest's is 0700, closed to other uids
        os.chmod(d, 0o755)
        with TestKubelet(Path(d) / "kubelet.sock") as k:
            k.set_pods(pod("ml", "train", ("main", [("nvidia.com/gpu", ["GPU-a"])])))
            os.chmod(k.socket_path, 0o755)  # as the kubelet creates it under umask 022
            yield k


def as_uid(socket: Path, *groups: int) -> str:
    setpriv = ["setpriv", "--reuid=65532", "--regid=65532"]
    setpriv += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    proc = subprocess.run(
        [*setpriv, sys.executable, "-c", CLIENT, str(socket)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_uid_65532_is_refused_then_let_in_by_the_sockets_group(kubelet: TestKubelet) -> None:
    out = as_uid(kubelet.socket_path)
    assert out.startswith("refused ") and "Permission denied" in out, out
    os.chown(kubelet.socket_path, 0, 2000)
    os.chmod(kubelet.socket_path, 0o775)
    assert as_uid(kubelet.socket_path, 2000) == "1"
