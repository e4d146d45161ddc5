"""The client is floor 1 (DESIGN.md module map): importing it must not pull in the server side."""

from __future__ import annotations

import ast
import subprocess
import sys


def test_client_imports_no_server_parts() -> None:
    code = ("import sys, scheduler.client; print(sorted(m for m in sys.modules "
            "if m.startswith('scheduler.') and not m.startswith('scheduler._gen')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = set(ast.literal_eval(r.stdout))
    server_side = {m for m in loaded if m.split(".")[1] in {"api", "store", "planner", "dispatch", "worker", "node",
                                                             "server", "model", "execution", "cli"}}
    assert not server_side, server_side
    assert "scheduler.client.client" in loaded
