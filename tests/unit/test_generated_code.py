"""The committed generated code must be exactly what scripts/gen_protos.py produces from proto/."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_gen_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = mod
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    gen = _load_gen_script()
    out = tmp_path / "_gen"
    gen.generate(out)
    fresh, committed = _tree(out), _tree(ROOT / "scheduler" / "_gen")
    assert sorted(fresh) == sorted(committed), "generated file set differs: run scripts/gen_protos.py"
    stale = [rel for rel in fresh if not filecmp.cmp(fresh[rel], committed[rel], shallow=False)]
    assert not stale, f"stale generated files {stale}: run `python scripts/gen_protos.py`"
