"""``python -m bench.soak`` (``make soak``): the soak for ``SOAK_SECONDS`` seconds of chaos (default 600); prints the
verdict and exits 1 when any check failed (the work directory, with the agent's logs, is kept then)."""

from __future__ import annotations

import os
import sys

from bench.soak import run_soak


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS") or 600)
    verdict = run_soak(seconds)
    print(verdict.render(), flush=True)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
