"""``python -m docsgen``: write the generated pages under ``docs/``; ``--check``: write nothing, exit 1 when a
committed page differs from what the code generates (each differing path is printed)."""

from __future__ import annotations

import argparse
import sys

from docsgen import ROOT, generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docsgen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in generate().items():
        path = ROOT / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for rel in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {rel}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
