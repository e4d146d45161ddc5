"""A small reader of deploy/Dockerfile's instructions (continuation lines joined, JSON-form arguments
parsed), so that tests check, and run, the very commands the image runs."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from tests.deploy.tools import DEPLOY

DOCKERFILE = DEPLOY / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # 0-based index of the FROM it belongs to


def instructions() -> list[Instruction]:
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment between continuation lines
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(keyword.upper(), args.strip(), stage))
    return out


def final_stage() -> list[Instruction]:
    ins = instructions()
    last = max(i.stage for i in ins)
    return [i for i in ins if i.stage == last]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env() -> dict[str, str]:
    """The final stage's ENV (key=value pairs), without PATH."""
    out: dict[str, str] = {}
    for i in final_stage():
        if i.keyword == "ENV":
            for pair in shlex.split(i.args):
                k, _, v = pair.partition("=")
                out[k] = v
    out.pop("PATH", None)
    return out


def healthcheck() -> tuple[dict[str, str], list[str]]:
    """HEALTHCHECK's options and its CMD in exec form."""
    (hc,) = [i for i in final_stage() if i.keyword == "HEALTHCHECK"]
    m = re.match(r"((?:--\S+=\S+\s+)*)CMD\s+(\[.*\])$", hc.args)
    assert m, hc.args
    opts = dict(o.removeprefix("--").split("=", 1) for o in m.group(1).split())
    return opts, exec_form(m.group(2))


def entrypoint() -> list[str]:
    (ep,) = [i for i in final_stage() if i.keyword == "ENTRYPOINT"]
    return exec_form(ep.args)
