"""A small Dockerfile reader (instructions per stage) and .dockerignore matcher, for tests that run without Docker."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    args: str
    flags: dict[str, str] = field(default_factory=dict)

    def words(self) -> list[str]:
        """The arguments: the JSON exec form, or split on whitespace."""
        if self.args.startswith("["):
            value = json.loads(self.args)
            assert isinstance(value, list)
            return [str(v) for v in value]
        return self.args.split()


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (with defaults) and the stages, continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "a continuation line at the end of the Dockerfile"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for text in logical:
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            key, _, value = flag[2:].partition("=")
            flags[key] = value
        rest = re.sub(r"\s+", " ", rest.strip())
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[0])
            stages.append(Stage(base=base, name=words[2] if len(words) > 2 else ""))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, flags))
    return args, stages


def env_of(stage: Stage) -> dict[str, str]:
    """ENV instructions of a stage, ``K=V`` form."""
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for pair in re.findall(r'(\w+)=("[^"]*"|\S+)', ins.args):
            env[pair[0]] = pair[1].strip('"')
    return env


def _pattern(glob: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out += ".*"
            i += 2
            if glob.startswith("/", i):
                out += "/?"
                i += 1
            continue
        ch = glob[i]
        out += "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch)
        i += 1
    return re.compile(out)


def ignored(path: str, dockerignore: Path) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or any directory above it."""
    result = False
    parts = path.strip("/").split("/")
    for raw in dockerignore.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = _pattern(line.lstrip("!").strip("/"))
        if any(pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            result = not negate
    return result
