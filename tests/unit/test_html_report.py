"""The HTML report without a browser (tests/browser/test_html_report.py draws it): its figures are
the dashboard's figure functions over the run's tables, the page carries plotly.js once and the
figures as inert JSON, it stays under 5 MB at 1,024 ranks, and building it never imports Dash."""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import plotly.offline
from click.testing import CliRunner

from benchmarks.synthetic_run import write_synthetic_run
from dashboard import figures
from dashboard.data import LoadedRun, expert_steps, step_times, timeline_window
from dashboard.html_report import plotly_js_gzip, report_figures
from diag import diagnose, load_any
from diag.cli.main import main
from diag.outputs.html_charts import Chart, inert_json
from diag.outputs.report import render_html

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden-runs"
FIGURE_RE = re.compile(r'<script type="application/json" class="diag-figure"[^>]*>(.*?)</script>')
PLOTLY_RE = re.compile(
    r'<script type="application/octet-stream" id="diag-plotly-gz">(.*?)</script>'
)


def _html(run: Path, tmp_path: Path, *args: str) -> str:
    out = tmp_path / f"{run.name}.html"
    result = CliRunner().invoke(main, ["analyze", str(run), "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def test_figures_are_the_dashboards_over_the_same_tables() -> None:
    run = load_any(GOLDEN / "dp-straggler")
    metrics, report = diagnose(run)
    built = report_figures(run, metrics, report)
    sections = [section for section, _ in built]
    assert sections[:2] == ["where the step goes", "step time over steps"]
    assert sections[2].startswith("timeline of steps")
    assert {"time per rank", "communication", "memory"} <= set(sections)
    loaded = LoadedRun("dp-straggler", run, metrics, report)
    blamed = loaded.blamed_ranks
    assert blamed == [1]  # the straggler, marked in the per-rank figures
    steps = sorted(int(s) for s in metrics.rank_steps["step"].unique())[:2]
    window = timeline_window(run, steps)
    times = step_times(loaded)
    assert times is not None and times.blamed == blamed
    expected = [
        figures.step_waterfall(report["attribution"]),
        figures.step_time_over_steps(times),
        figures.timeline(window.spans, window.comms, blamed),
        figures.rank_breakdown(metrics.ranks, blamed),
        figures.bytes_vs_expected(metrics.collectives),
    ]
    assert [f.to_json() for _, f in built[:5]] == [f.to_json() for f in expected]


def test_an_expert_parallel_run_has_its_expert_load() -> None:
    run = load_any(GOLDEN / "ep")
    metrics, report = diagnose(run)
    built = report_figures(run, metrics, report)
    experts = [f for section, f in built if section == "expert load"]
    layers = expert_steps(run.experts)
    assert len(experts) == 1 + len(layers) and layers
    assert (
        experts[1].to_json()
        == figures.expert_heatmap(layers[0].layer, layers[0].steps, layers[0].tokens).to_json()
    )


def test_the_page_holds_plotly_once_and_every_figure_as_json(tmp_path: Path) -> None:
    page = _html(GOLDEN / "dp-straggler", tmp_path, "--format", "html")
    assert page.startswith("<!doctype html>")
    packed = PLOTLY_RE.findall(page)
    assert len(packed) == 1
    assert gzip.decompress(base64.b64decode(packed[0])).decode() == plotly.offline.get_plotlyjs()
    run = load_any(GOLDEN / "dp-straggler")
    built = report_figures(run, *diagnose(run))
    held = [json.loads(text) for text in FIGURE_RE.findall(page)]
    assert held == [json.loads(f.to_json()) for _, f in built]
    # findings before the figures, the tables after them
    assert page.index("<h2>Findings</h2>") < page.index("diag-chart-0") < page.index("<table>")
    assert "http" not in page  # nothing points elsewhere (the bundle travels compressed)


def test_the_out_suffix_picks_html(tmp_path: Path) -> None:
    assert "diag-plotly-gz" in _html(GOLDEN / "dp", tmp_path)  # RUN/dp.html


def test_figure_json_cannot_close_its_element() -> None:
    hostile = '{"name": "</script><script>alert(1)</script><!-- & -->"}'
    inert = inert_json(hostile)
    assert "<" not in inert and ">" not in inert and "&" not in inert
    assert json.loads(inert) == json.loads(hostile)
    page = render_html(_minimal_report(), [Chart("<b>part</b>", inert)], b"")
    assert "<b>part" not in page and "&lt;b&gt;part&lt;/b&gt;" in page
    assert page.count("</script>") == 3  # the figure, the bundle, the loader: none from the name


def _minimal_report() -> dict[str, object]:
    run = load_any(GOLDEN / "dp")
    return diagnose(run)[1]


def test_without_charts_the_page_has_no_script() -> None:
    page = render_html(_minimal_report())
    assert "<script" not in page


def test_a_1024_rank_report_stays_under_5_MB(tmp_path: Path) -> None:
    run = tmp_path / "dp1024"
    write_synthetic_run(run, ranks=1024, steps=4, microbatches=1)
    page = _html(run, tmp_path, "--format", "html")
    size_bytes = len(page.encode())
    assert size_bytes < 5_000_000, size_bytes
    figures_bytes = sum(len(text) for text in FIGURE_RE.findall(page))
    assert figures_bytes < 1_000_000, figures_bytes  # grouped: the figures grow with the hosts
    assert "by host" in page  # 1,024 ranks are grouped by host, as on the dashboard


def test_building_the_report_imports_no_dash() -> None:
    probe = (
        "import sys\n"
        "from dashboard.html_report import report_charts, plotly_js_gzip\n"
        "from diag import diagnose, load_any\n"
        f"run = load_any({str(GOLDEN / 'dp')!r})\n"
        "report_charts(run, *diagnose(run))\n"
        "print('dash' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


def test_plotly_is_compressed_once_per_process() -> None:
    assert plotly_js_gzip() is plotly_js_gzip()
