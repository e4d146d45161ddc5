"""What a drill check returns: one `Invariant` per I1-I9 (status, what was checked, the first
counterexamples), a row per fault window, and the `Verdict` with its exit code. Data only: the checks
that fill it are chaos/check.py and the modules it composes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXAMPLES", "EXIT", "INVARIANTS", "FaultRow", "Invariant", "Verdict"]

EXIT = {"pass": 0, "fail": 1, "invalid": 3}
INVARIANTS = {
    "I1": "at most one effect per execution id",
    "I2": "no planned time missed silently",
    "I3": "start lag within bounds",
    "I4": "fencing rejects stale planners",
    "I5": "watermarks monotone",
    "I6": "one owner per partition per revision",
    "I7": "liveness after heal",
    "I8": "no unexpected errors in the logs",
    "I9": "overlap policy respected",
}
EXAMPLES = 20  # counterexamples kept per invariant (all are counted)


@dataclass
class Invariant:
    id: str
    name: str
    checked: int = 0
    count: int = 0
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(text)

    @property
    def status(self) -> str:
        if self.count:
            return "fail"
        return "pass" if self.checked else "n/a"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "checked": self.checked, "violations": self.count,
                "counterexamples": self.examples, "notes": self.notes}


@dataclass
class FaultRow:
    index: int
    type: str
    name: str
    target: str
    start_s: float  # from the run's start
    duration_s: float | None
    healthy_after_s: float | None  # from the fault's end until healthy again
    planned_inside: int = 0
    takeovers: int = 0
    stale_rejected: int = 0
    rto_s: float | None = None
    late_runs: int = 0


@dataclass
class Verdict:
    result: str  # pass | fail | invalid
    scenario: str
    seed: int
    invariants: dict[str, Invariant]
    invalid: list[str]
    faults: list[FaultRow]
    stats: dict[str, Any]
    meta: dict[str, Any]
    # For the picture: (planned ms, lag ms) per run; ownership lanes (partition, node, from ms, to ms).
    lag_points: list[tuple[int, int]] = field(default_factory=list)
    lanes: list[tuple[int, str, int, int | None]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT[self.result]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.result, "exit_code": self.exit_code, "scenario": self.scenario, "seed": self.seed,
                "invalid_because": self.invalid, "invariants": {k: v.to_json() for k, v in self.invariants.items()},
                "faults": [f.__dict__ for f in self.faults], "stats": self.stats, "meta": self.meta}
