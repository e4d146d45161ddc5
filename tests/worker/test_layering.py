"""The worker SDK is floor 3 (docs/architecture.md, "Modules"): importing it, or its executors, must
not pull in the server side.

Forbidden: its floor-3 siblings (`api`, `dispatch`), everything above it (`planner`, `node`,
`server`, `cli`), and `store` with the etcd declarations: store is below it, but a worker reaches
etcd only through a planner's stream, so a worker process has no use for an etcd client. Allowed:
floors 1-2 (`timeplan`, `clock`, `errors`, `config`, `timeconv`, `status`, `model`, ...) and `metrics`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import scheduler.metrics

SERVER_SIDE = {"api", "dispatch", "planner", "node", "server", "cli", "store"}


def loaded_after(*modules: str) -> set[str]:
    code = (f"import sys; import {', '.join(modules)}; print(sorted(m for m in sys.modules "
            "if m.startswith('scheduler.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return set(ast.literal_eval(r.stdout))


def test_worker_sdk_imports_no_server_parts() -> None:
    loaded = loaded_after("scheduler.worker", "scheduler.worker.executors", "scheduler.worker.executors.http",
                          "scheduler.worker.executors.shell")
    server_side = {m for m in loaded if m.split(".")[1] in SERVER_SIDE}
    assert not server_side, server_side
    assert not {m for m in loaded if m.startswith("scheduler._gen.etcd")}, "etcd's declarations come with store"
    assert {"scheduler.worker.worker", "scheduler.worker.executors.shell"} <= loaded


def test_metrics_do_not_import_the_worker() -> None:
    """The worker's gauges read `Worker.status()` through a callable (`WorkerMetrics.observe`), so no
    metrics module imports the worker, not even for type checking: that was an import cycle."""
    imported: dict[str, set[str]] = {}
    for path in Path(scheduler.metrics.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):  # walks into `if TYPE_CHECKING:` blocks too
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.setdefault(path.name, set()).add(node.module)
            elif isinstance(node, ast.Import):
                imported.setdefault(path.name, set()).update(a.name for a in node.names)
    assert not {f: ms for f, m in imported.items() if (ms := {x for x in m if x.startswith("scheduler.worker")})}
    assert "scheduler.status" in imported["worker.py"]
    assert not {m for m in loaded_after("scheduler.metrics.worker") if m.startswith("scheduler.worker")}
