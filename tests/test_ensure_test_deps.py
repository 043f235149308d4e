"""scripts/ensure-test-deps, the Debian half of what `make test` installs: run as a real subprocess with ``apt-get``,
``id`` and ``dpkg-query`` replaced by recording stand-ins on PATH (nothing is installed), and the policy-rc.d path
pointed into tmp_path. A service start asked for during the install is denied (exit 101); the policy file that was
there before is back afterwards, byte for byte, or gone when there was none."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ensure-test-deps"
BASH = shutil.which("bash") or "/bin/bash"
TOOLS = ("mktemp", "cp", "mv", "rm", "chmod", "cat")

# apt-get: logs its arguments; on install, asks the policy whether prometheus may start (as invoke-rc.d does).
APT_GET = """#!{bash}
echo "apt-get $*" >>"{log}"
if [ "$1" = install ]; then
  "$POLICY_RC_D" prometheus start; echo "policy says $?" >>"{log}"
  exit {install_rc}
fi
"""

# dpkg-query -W -f '${{Status}}' PACKAGE: "installed" for the packages named, nothing (exit 1) for the others.
DPKG_QUERY = """#!{bash}
for pkg in {installed}; do
  if [ "$pkg" = "$4" ]; then printf 'install ok installed'; exit 0; fi
done
exit 1
"""
EVERY_COMMAND = ("promtool", "prometheus", "prometheus-node-exporter", "chromium", "chromedriver")
EVERY_COMMAND_PACKAGE = "prometheus prometheus-node-exporter chromium chromium-driver"


def run(
    tmp_path: Path,
    *,
    uid: int = 0,
    install_rc: int = 0,
    have: tuple[str, ...] = (),
    installed: tuple[str, ...] | None = None,
    strict: bool = False,
) -> tuple[int, str, str]:
    """The script's exit code, stderr and the stand-ins' log. ``have``: the commands on PATH; ``installed``: the
    packages dpkg-query says are installed, or None for no dpkg-query at all (the script then asks only for
    commands)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    log.touch()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real is not None, tool
        (bin_dir / tool).symlink_to(real)
    stubs = {
        "id": f"#!{BASH}\necho {uid}\n",
        "apt-get": APT_GET.format(bash=BASH, log=log, install_rc=install_rc),
        **{name: f"#!{BASH}\nexit 0\n" for name in have},
    }
    if installed is not None:
        stubs["dpkg-query"] = DPKG_QUERY.format(bash=BASH, installed=" ".join(installed))
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": str(bin_dir), "POLICY_RC_D": str(tmp_path / "policy-rc.d")}
    env.pop("REQUIRE_TEST_DEPS", None)
    if strict:
        env["REQUIRE_TEST_DEPS"] = "1"
    proc = subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stderr, log.read_text()


@pytest.mark.parametrize("before", [None, "#!/bin/sh\n# the image's own policy\nexit 101\n"])
def test_installs_the_missing_packages_with_service_starts_denied_then_restores_the_policy(
    tmp_path: Path, before: str | None
) -> None:
    policy = tmp_path / "policy-rc.d"
    if before is not None:
        policy.write_text(before)
        policy.chmod(0o700)
    rc, err, calls = run(tmp_path)
    assert rc == 0, err
    assert calls.splitlines() == [
        "apt-get update -qq",
        f"apt-get install -y -qq --no-install-recommends {EVERY_COMMAND_PACKAGE}",
        "policy says 101",
    ]
    if before is None:
        assert not policy.exists()
    else:
        assert policy.read_text() == before and policy.stat().st_mode & 0o777 == 0o700


def test_only_what_is_missing(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, have=("promtool", "prometheus", "chromium"))
    assert rc == 0, err
    assert (
        "apt-get install -y -qq --no-install-recommends prometheus-node-exporter chromium-driver" in calls.splitlines()
    )


@pytest.mark.parametrize("browser", ["chromium", "chromium-browser"])
def test_either_name_of_the_browser_will_do(tmp_path: Path, browser: str) -> None:
    rc, err, calls = run(tmp_path, have=("promtool", "prometheus", "prometheus-node-exporter", browser))
    assert rc == 0, err
    assert "apt-get install -y -qq --no-install-recommends chromium-driver" in calls.splitlines()


@pytest.mark.parametrize(
    ("installed", "wanted"),
    [
        ((), "libfaketime fonts-dejavu-core"),
        (("libfaketime",), "fonts-dejavu-core"),
        (("fonts-dejavu-core",), "libfaketime"),
    ],
)
def test_packages_without_a_command_are_asked_of_dpkg(tmp_path: Path, installed: tuple[str, ...], wanted: str) -> None:
    rc, err, calls = run(tmp_path, have=EVERY_COMMAND, installed=installed)
    assert rc == 0, err
    assert f"apt-get install -y -qq --no-install-recommends {wanted}" in calls.splitlines()


def test_nothing_to_do_when_everything_is_there(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, have=EVERY_COMMAND, installed=("libfaketime", "fonts-dejavu-core"))
    assert (rc, err, calls) == (0, "", "")


def test_a_failed_install_does_not_fail_the_run_and_still_restores(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, install_rc=100)
    assert rc == 0
    assert f"apt-get could not install {EVERY_COMMAND_PACKAGE} (offline?)" in err
    assert "policy says 101" in calls
    assert not (tmp_path / "policy-rc.d").exists()


def test_not_root_says_what_it_did_not_install(tmp_path: Path) -> None:
    rc, err, calls = run(tmp_path, uid=1000)
    assert rc == 0 and calls == ""
    assert f"{EVERY_COMMAND_PACKAGE} not installed (that needs root and apt-get)" in err


@pytest.mark.parametrize("case", ["not root", "install failed"])
def test_ci_makes_a_missing_tool_an_error(tmp_path: Path, case: str) -> None:
    """.ci/run sets REQUIRE_TEST_DEPS: there, tests skipped for a tool it could not install would hide a broken CI."""
    rc, err, _ = run(tmp_path, uid=1000 if case == "not root" else 0, install_rc=100, strict=True)
    assert rc == 1 and "ensure-test-deps: " in err
    assert not (tmp_path / "policy-rc.d").exists()
