"""One figure per distinct result (issue 35, item 6): chips whose loop (or simulator) outputs are identical share the
first chip's figure instead of drawing copies of it. Real compiles, simulator loops and doit report on two chips."""
from __future__ import annotations

import json

import pytest
from test_loops import acc_project


@pytest.mark.slow
def test_identical_loops_on_two_chips_draw_one_figure(tmp_path):
    project = acc_project(tmp_path / "project")
    project.edit("models/acc/model.yaml", "socs: [SM8650]", "socs: [SM8650, SM8750]")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(project.path("build/report/report.json").read_text())
    first, second = sorted(report["loops"], key=lambda e: e["name"])
    digests = [next(f["sha256"] for p, f in e["record"]["files"].items() if p.endswith("/outputs.npz"))
               for e in (first, second)]
    assert digests[0] == digests[1]  # the simulator gives both chips the same per-step numbers
    html = project.path("build/report/index.html").read_text()
    loops = html[html.index("<h2>Loops"):html.index("</table>", html.index("<h2>Loops"))]
    assert loops.count("<img") == 1  # was 2: the same plot drawn once per chip
    assert "The same on 1 more chip (SM8750): one figure for identical numbers." in loops
    assert 'Figure: same as <a href="#loop-acc-SM8650">SM8650</a> (identical per-step numbers).' in loops
    # the targets' CPU vs NPU figures are grouped the same way (their simulator outputs are identical too)
    targets = [t["stages"]["simulate"]["files"] for t in sorted(report["targets"], key=lambda t: t["name"])]
    assert len({f["sha256"] for files in targets for p, f in files.items() if p.endswith("/outputs.npz")}) == 1
    assert html.count('<img alt="CPU vs NPU outputs') == 1
    assert 'CPU vs NPU figure: same as <a href="#acc-SM8650">SM8650</a> (identical outputs).' in html
