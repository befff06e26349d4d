"""Shared test helpers: write run directories from a manifest dict and records per rank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
MS = 1_000_000
"""ns per ms: helpers take times in ms and write ns."""
BASE_NS = 1_700_000_000_000_000_000
"""A wall-clock origin, so tests catch any float rounding of ns timestamps."""


class RunWriter:
    """Writes run directories under a temporary folder; record builders take times in ms."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def manifest(world_size: int = 2, **fields: Any) -> dict[str, Any]:
        layout = {"dp": world_size, "tp": 1, "pp": 1, "microbatches": 1, "virtual_stages": 1}
        layout.update(fields.pop("layout", {}))
        return {
            "schema": "diag.run/1",
            "run_id": fields.pop("run_id", "test-run"),
            "created": "2026-01-01T00:00:00Z",
            "trainer": "dp",
            "world_size": world_size,
            "backend": "gloo",
            "device_type": "cpu",
            "layout": layout,
            "ranks": [{"rank": r, "host": f"h{r // 2}"} for r in range(world_size)],
            "status": "complete",
            **fields,
        }

    def write(
        self,
        records: dict[int, list[dict[str, Any] | str]],
        manifest: dict[str, Any] | str | None = None,
        name: str = "run",
    ) -> Path:
        """A run dir: `manifest` as a dict (default: `self.manifest(len(records))`), raw text, or
        None for the default; each rank's records as dicts (one JSON line) or raw lines."""
        run_dir = self.root / name
        run_dir.mkdir(parents=True)
        if manifest is None:
            manifest = self.manifest(world_size=max(len(records), 1))
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (run_dir / "manifest.json").write_text(text)
        for rank, rows in records.items():
            lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
            (run_dir / f"rank-{rank:05d}.jsonl").write_text("".join(f"{x}\n" for x in lines))
        return run_dir

    @staticmethod
    def step(step: int, t0_ms: float, t1_ms: float, tokens: int = 100, **kw: Any) -> dict[str, Any]:
        return {"kind": "step", "step": step, "t0": _ns(t0_ms), "t1": _ns(t1_ms),
                "tokens": tokens, "loss": kw.pop("loss", 1.0), **kw}  # fmt: skip

    @staticmethod
    def span(step: int, phase: str, t0_ms: float, t1_ms: float, **kw: Any) -> dict[str, Any]:
        return {"kind": "span", "step": step, "mb": 0, "phase": phase,
                "t0": _ns(t0_ms), "t1": _ns(t1_ms), **kw}  # fmt: skip

    @staticmethod
    def comm(step: int, t0_ms: float, t1_ms: float, **kw: Any) -> dict[str, Any]:
        fields = {"op": "all_reduce", "group": "dp", "group_size": 2, "bytes": 1000, **kw}
        return {"kind": "comm", "step": step, "t0": _ns(t0_ms), "t1": _ns(t1_ms), **fields}

    @staticmethod
    def mem(step: int, **kw: Any) -> dict[str, Any]:
        fields = ("params", "grads", "optimizer", "activations", "comm_buffers", "fragmentation")
        return {"kind": "mem", "step": step, **dict.fromkeys(fields, 0), **kw}

    @staticmethod
    def experts(step: int, layer: int, tokens: list[int], **kw: Any) -> dict[str, Any]:
        return {"kind": "experts", "step": step, "layer": layer, "tokens": tokens, **kw}

    def simple_rank(self, steps: int = 3, step_ms: float = 100) -> list[dict[str, Any] | str]:
        """`steps` steps of fwd (first half) and bwd (second half), no communication."""
        rows: list[dict[str, Any] | str] = []
        for s in range(steps):
            t0 = s * step_ms
            rows += [self.span(s, "fwd", t0, t0 + step_ms / 2),
                     self.span(s, "bwd", t0 + step_ms / 2, t0 + step_ms),
                     self.step(s, t0, t0 + step_ms)]  # fmt: skip
        return rows


def raw_records(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """A rank's records as written, in whichever format its writer chose (diag.cli.convert reads
    both); an unreadable record fails the test."""
    from diag.rankfile.convert import rank_file, rank_records

    path = rank_file(run_dir, rank)
    assert path is not None, f"no rank file of rank {rank} in {run_dir}"
    notes: list[str] = []
    records = rank_records(path, notes)
    assert notes == [], notes
    return records


def _ns(ms: float) -> int:
    return BASE_NS + round(ms * MS)


@pytest.fixture
def runs(tmp_path: Path) -> RunWriter:
    return RunWriter(tmp_path)


@pytest.fixture
def golden_dp2() -> Path:
    """tests/data/dp2-golden: 2 DP ranks, 3 steps, every metric computed by hand in test_metrics."""
    return DATA / "dp2-golden"


def copy_with_names(run_dir: Path, dest: Path, name: str) -> Path:
    """A copy of a run whose manifest calls the run and every host `name` (tests feed it
    markup to check that the names render as text)."""
    shutil.copytree(run_dir, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["run_id"] = name
    for rank in manifest["ranks"]:
        rank["host"] = name
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture(autouse=True)
def private_user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Every test (and the processes it starts) keeps diag's user cache and signing secret in
    one folder of this session, never in the home directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
