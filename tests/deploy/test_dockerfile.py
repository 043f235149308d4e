"""The Dockerfile, exercised without a Docker engine: every path it copies exists and is in the build context, and
its build stage's RUN steps, run for real in fresh virtual environments, produce a working agent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import nvdaemon
from tests.deploy.dockerfile import Stage, env_of, ignored, parse

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ARGS, STAGES = parse(DOCKERFILE)
BUILD, FINAL = STAGES[0], STAGES[-1]
UID = "65532"


def _context_files(source: str) -> list[Path]:
    path = ROOT / source
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [f for f in files if not ignored(str(f.relative_to(ROOT)), DOCKERIGNORE)]


def test_stages() -> None:
    assert len(STAGES) == 2
    assert BUILD.name == "build"
    assert BUILD.base == FINAL.base
    assert FINAL.base.startswith("python:3.11-slim")


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    copies = [c for s in STAGES for c in s.all("COPY") if "from" not in c.flags]
    assert copies
    for copy in copies:
        *sources, _ = copy.words()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the project"
            assert _context_files(source), f"COPY {source}: excluded by .dockerignore"


def test_dockerignore_keeps_the_context_small() -> None:
    for path in (".venv/bin/python", ".git/HEAD", "tests/test_config.py", ".state/x", "nvdaemon/__pycache__/a.pyc"):
        assert ignored(path, DOCKERIGNORE), path
    for path in ("pyproject.toml", "nvdaemon/cli.py", "nvdaemon/default.yaml", "requirements/runtime.txt"):
        assert not ignored(path, DOCKERIGNORE), path


def test_final_stage_runs_the_console_script_as_non_root_without_build_tools() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = FINAL.all("ENTRYPOINT")
    assert entry.words() == ["nvdaemon"] and "nvdaemon" in scripts
    (cmd,) = FINAL.all("CMD")
    assert cmd.words()[0] == "run"
    (user,) = FINAL.all("USER")
    assert user.args == f"{UID}:{UID}"
    runs = " ".join(r.args for r in FINAL.all("RUN"))
    assert "install -y --no-install-recommends smartmontools" in runs
    assert "pip uninstall --yes --quiet pip setuptools wheel" in runs
    for tool in ("gcc", "build-essential", "make ", "python3-dev"):
        assert tool not in runs
    (copy,) = FINAL.all("COPY")
    assert copy.flags == {"from": "build"} and copy.words() == ["/opt/nvdaemon", "/opt/nvdaemon"]
    assert env_of(FINAL)["PATH"].startswith("/opt/nvdaemon/bin:")
    assert env_of(BUILD)["VENV"] == "/opt/nvdaemon"


def test_the_image_installs_from_the_hash_locks() -> None:
    runs = " ".join(r.args for r in BUILD.all("RUN"))
    assert "--require-hashes --only-binary=:all: -r requirements/build.txt" in runs
    assert "--require-hashes --only-binary=:all: -r requirements/runtime.txt" in runs
    assert "--no-index" in runs  # the project wheel gets nothing that is not in the lock


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError:
        return False
    return True


@dataclass
class Built:
    venv: Path
    build_log: str


def _run_build_stage(stage: Stage, work: Path) -> Built:
    """Stage the COPYs into a context directory and run each RUN with the stage's ENV, its paths moved under
    ``work``; ``python`` is this interpreter's base Python (3.11, as the image's)."""
    context = work / "src"
    shims = work / "shims"
    shims.mkdir(parents=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    (shims / "python").symlink_to(base_python)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_NO_CACHE", "VIRTUAL_ENV", "PYTHON"))}
    env.update(env_of(stage))
    env.pop("PIP_NO_CACHE_DIR", None)  # the local pip cache keeps the test fast; the image builds without one
    moved = {"VENV": work / "opt-nvdaemon", "BUILD_VENV": work / "opt-build", "WHEELHOUSE": work / "wheels"}
    env.update({k: str(v) for k, v in moved.items()})
    env["PATH"] = f"{shims}:{env.get('PATH', '/usr/bin:/bin')}"
    log = []
    for ins in stage.instructions:
        if ins.keyword == "WORKDIR":
            context.mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            *sources, dest = ins.words()
            for source in sources:
                for f in _context_files(source):
                    rel = f.relative_to(ROOT / source) if (ROOT / source).is_dir() else Path(f.name)
                    target = context / dest / rel if dest.endswith("/") else context / dest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, target)
        elif ins.keyword == "RUN":
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", ins.args],
                cwd=context,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            log.append(f"$ {ins.args}\n{proc.stdout}{proc.stderr}")
            assert proc.returncode == 0, "\n".join(log)
        else:
            assert ins.keyword in ("ENV", "ARG", "LABEL"), f"the test does not know {ins.keyword}"
    return Built(venv=moved["VENV"], build_log="\n".join(log))


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if not _pypi_reachable():
        pytest.skip("network: PyPI (pypi.org:443) unreachable; the Dockerfile's install steps need the package index")
    return _run_build_stage(BUILD, tmp_path_factory.mktemp("docker-build"))


@pytest.mark.network
def test_build_stage_produces_the_console_script(built: Built) -> None:
    proc = subprocess.run(
        [str(built.venv / "bin" / "nvdaemon"), "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"nvdaemon {nvdaemon.__version__}"
    assert not (built.venv / "bin" / "pip").exists(), "the runtime venv carries no pip"


@pytest.mark.network
def test_every_module_imports_from_the_locked_set(built: Built) -> None:
    """A dependency imported by the agent but missing from pyproject and the lock fails here, not in production."""
    code = (
        "import importlib, pkgutil, nvdaemon\n"
        "for m in pkgutil.walk_packages(nvdaemon.__path__, 'nvdaemon.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(nvdaemon.__file__)\n"
    )
    proc = subprocess.run(
        [str(built.venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(built.venv)), "imported the checkout, not the installed wheel"
    default = subprocess.run(
        [str(built.venv / "bin" / "python"), "-c", "from nvdaemon.configload import load_config; load_config(None)"],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert default.returncode == 0, "the wheel lacks the embedded default config:\n" + default.stderr
