"""The run's summary, HTML report and CI step summary, end to end with pytester on fake Records (no
training), and the report rendered by a real browser (headless Chromium) where one is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.store import BaselineStore
from memclaims.cli import main
from memclaims.core.record import Record
from memclaims.pytest.testing import FAKE_PEAK, fake_record, make_project
from memclaims.report import html_report, step_summary
from memclaims.report import summary_document as run_summary

pytest_plugins = ["pytester"]

INNER_TEST = """
import json, pathlib, pytest
from memclaims.core.record import Record

HERE = pathlib.Path(__file__).parent

@pytest.mark.parametrize("name", sorted(p.stem for p in HERE.glob("rec_*.json")))
def test_case(name, baseline_check, record_property):
    raw = json.loads((HERE / (name + ".json")).read_text())
    baseline_check.check("cpu:" + raw["recipe"], Record.from_dict(raw), record_property)

def test_plain_failure():
    assert 1 + 1 == 3, "arithmetic moved"
"""
PHASES = {"load": 3000, "forward": 6_000_000, "backward": FAKE_PEAK, "optimizer_step": 8_000_000}


def with_phases(record: Record, factor: float = 1.0, **changes: Any) -> Record:
    raw = record.to_dict()
    raw["phases"] = {p: {"allocated_bytes": int(v * factor), "above_start_bytes": int(v * factor / 2)}
                     for p, v in PHASES.items()}
    raw["peak_allocated_bytes"] = int(raw["peak_allocated_bytes"] * factor)
    raw.update(changes)
    return Record.from_dict(raw)


def run_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> tuple[pytest.RunResult, Path]:
    make_project(pytester, ROOT).makepyfile(test_fake=INNER_TEST)
    store = BaselineStore(pytester.path / "baselines")
    grown = with_phases(fake_record("vit-smoke/fake-a"), 1.2)
    steady = with_phases(fake_record("vit-smoke/fake-b"))
    store.store_record(with_phases(fake_record("vit-smoke/fake-a"), versions={**grown.versions, "torch": "2.13.0"}))
    store.store_record(steady)
    for name, record in (("a", grown), ("b", steady)):
        (pytester.path / f"rec_{name}.json").write_text(record.to_json())
    step = pytester.path / "step-summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    # The README's nightly command: both files into a folder that does not exist yet.
    assert not (pytester.path / "nightly").exists()
    result = pytester.runpytest("-p", "no:cacheprovider", "--memclaims-summary-json=nightly/summary.json",
                                "--memclaims-html=nightly/report.html")
    return result, pytester.path


def test_a_run_writes_summary_html_and_step_summary(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    result, here = run_project(pytester, monkeypatch)
    result.assert_outcomes(passed=1, failed=2)
    data = run_summary.load(here / "nightly" / "summary.json")
    assert data["schema"] == run_summary.SCHEMA
    assert data["outcomes"] == {"passed": 1, "failed": 2}
    failed = {f["nodeid"].split("::")[-1]: f["message"] for f in data["failures"]}
    assert "arithmetic moved" in failed["test_plain_failure"]
    assert "peak_allocated_bytes" in failed["test_case[rec_a]"] and "torch 2.13.0 -> 2.14.1" in failed["test_case[rec_a]"]
    bars = run_summary.phase_bars(data)
    assert bars["cpu:vit-smoke/fake-a"]["forward"] == (6_000_000, 7_200_000)
    assert data["session"]["versions"]["torch"]  # the installed one, read at the end of the run

    page = (here / "nightly" / "report.html").read_text()
    assert page.index("What failed and why") < page.index("Memory per phase") < page.index("Claims")
    assert "arithmetic moved" in page and "torch 2.13.0 -&gt; 2.14.1" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page  # self-contained
    assert 'class="n worse"' in page  # fake-a's phases grew: drawn red

    step = (here / "step-summary.md").read_text()
    assert step.startswith("earlier step\n## memclaims: FAILED (2 failed, 1 passed)")  # appended, not replaced
    assert step.index("### Failures") < step.index("### Baselines") < step.index("**Environment**")
    assert "`test_fake.py::test_plain_failure`: AssertionError: arithmetic moved" in step


def test_the_report_lists_only_the_claims_this_run_decided() -> None:
    def claim(name: str, verdict: str) -> dict[str, Any]:
        return {"claim": name, "kind": "relation", "where": "article", "tiers": {"cpu": {"checked_by": "cpu:x",
                                                                                        "verdict": verdict,
                                                                                        "at": "02:00" if verdict != "not run" else ""}}}

    data = {"schema": run_summary.SCHEMA, "rows": [], "out_of_memory": [], "failures": [], "outcomes": {"passed": 1},
            "diagnosis": [], "session": {},
            "claims": [claim("bf16 saves memory", "holds"), *(claim(f"unchecked {i}", "not run") for i in range(99))]}
    page = html_report.render(data)
    assert "bf16 saves memory" in page and "unchecked 0" not in page and "99 claim(s) this run did not check" in page
    assert page.index("Memory per phase") < page.index("Claims")  # the cases that ran, before the claims


@pytest.mark.parametrize("option", ["--memclaims-summary-json", "--memclaims-html"])
def test_an_unwritable_report_path_is_one_line_before_anything_runs(pytester: pytest.Pytester, option: str) -> None:
    make_project(pytester, ROOT).makepyfile(test_fake=INNER_TEST)
    (pytester.path / "a-file").write_text("")  # a folder under a file cannot be made, by root either
    result = pytester.runpytest("-p", "no:cacheprovider", f"{option}=a-file/nightly/out")
    text = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    problem = [line for line in result.errlines if option in line]
    assert len(problem) == 1 and "a-file/nightly/out" in problem[0] and "writable folder" in problem[0], text
    assert "Traceback" not in text and "collected" not in text  # nothing ran


def test_report_command_renders_a_saved_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "night.json"
    data = {"rows": [{"case": "cpu:x", "environment": "cpu-e", "metric": "phases.load.allocated_bytes",
                      "baseline": 100, "now": 150, "change": "+50.00 %", "change_pct": 50.0, "verdict": "regression",
                      "tolerance": 0.005, "environment_change": "torch 2.13.0 -> 2.14.1"}],
            "diagnosis": [str(tmp_path / "results" / "cpu-x.breakdown.json")]}
    summary.write_text(json.dumps(data))
    assert main(["report", str(summary)]) == 0
    page = (tmp_path / "night.html").read_text()
    assert 'href="results/cpu-x.breakdown.json"' in page  # relative to the page: it moves with its folder
    assert "regression" in page and "torch 2.13.0 -&gt; 2.14.1" in page


@pytest.mark.parametrize("content, expected", [
    (None, "no such file"), ("{", "not a memclaims summary JSON"), ("[]", "no 'rows' list")])
def test_report_of_a_bad_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          content: str | None, expected: str) -> None:
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and expected in err


def test_step_summary_counts_claim_verdicts_per_tier() -> None:
    data = run_summary.load_dict({"rows": [], "claims": [
        {"claim": "a", "kind": "ratio", "where": "text", "tiers": {"cpu": {"checked_by": "t", "verdict": "holds", "at": "T"},
                                                                    "sim": {"checked_by": "t", "verdict": "not run", "at": ""}}},
        {"claim": "b", "kind": "ratio", "where": "text", "tiers": {"cpu": {"checked_by": "t", "verdict": "does not hold", "at": "T"},
                                                                    "sim": {"not_checked": "why"}}}]})
    text = step_summary.markdown(data)
    assert "| cpu | 1 does not hold, 1 holds |" in text and "| sim |" not in text
    assert "FAILED" not in text and "no tests reported" in text


# A failed night as the plugin writes it (the pytester test above checks the plugin writes this shape).
BROWSER_DOCUMENT: dict[str, Any] = {
    "rows": [{"case": "cpu:vit-smoke/fake-a", "environment": "cpu-x86_64", "metric": f"phases.{p}.allocated_bytes",
              "baseline": v, "now": v * 6 // 5, "change": "+20.00 %", "change_pct": 20.0, "verdict": "regression",
              "tolerance": 0.005, "environment_change": "torch 2.13.0 -> 2.14.1"} for p, v in PHASES.items()],
    "failures": [{"nodeid": "test_fake.py::test_plain_failure", "when": "call", "line": "AssertionError",
                  "message": "AssertionError: arithmetic moved"}],
    "outcomes": {"failed": 1, "passed": 12},
    "claims": [{"claim": "bf16-true-below-16-mixed", "kind": "memory", "where": "text", "tiers": {
                   "cpu": {"checked_by": "t", "verdict": "holds", "at": "T"}, "sim": {"checked_by": "t", "verdict": "holds", "at": "T"},
                   "gpu": {"checked_by": "t", "verdict": "skipped", "at": "T", "detail": "needs a CUDA GPU"},
                   "dist": {"not_checked": "one process"}}},
               {"claim": "adam8bit-state-0.3x", "kind": "ratio", "where": "course", "tiers": {
                   "cpu": {"checked_by": "t", "verdict": "does not hold", "at": "T"},
                   "sim": {"checked_by": "t", "verdict": "not run", "at": ""}, "gpu": {"not_checked": "-"},
                   "dist": {"not_checked": "-"}}}],
    "session": {"started": "2026-12-01T02:00:00Z", "duration_s": 412.5, "exit_status": 1, "platform": "Linux-x86_64",
                "host": "gpu-runner-1", "versions": {"torch": "2.14.1", "lightning": "2.6.6"}, "arguments": ["-m", "cpu"]},
}
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


# Appended to a copy of the page: what the browser laid out, as a reader sees it, written into the DOM
# that --dump-dom prints (section tops, claim rows and their verdict colours, every phase bar's width).
_LAYOUT_PROBE = """<script>
const topOf = id => document.getElementById(id).getBoundingClientRect().top;
const claims = [...document.querySelectorAll('#claims ~ table')][0];
const rows = [...claims.querySelectorAll('tr')].slice(1).map(r => [...r.cells].map(c => [c.textContent.trim(),
  getComputedStyle(c).color]));
const bars = [...document.querySelectorAll('table.bars tr')].map(r => [r.cells[0].textContent,
  ...[...r.querySelectorAll('td.bar div')].map(d => d.getBoundingClientRect().width)]);
const probe = document.createElement('pre'); probe.id = 'probe';
probe.textContent = JSON.stringify({tops: ['failures', 'claims', 'phases'].map(topOf), rows, bars,
  failure: document.querySelector('#failures ~ h3').innerText + ' ' + document.querySelector('#failures ~ pre').innerText});
document.body.appendChild(probe);
</script>"""


@pytest.mark.requires(**({} if CHROMIUM else {"unsupported": (
    "needs headless Chromium to render the HTML report in a real browser: apt-get install chromium (Debian)",)}))
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    import html
    import re

    here = tmp_path
    page, shot = html_report.write(run_summary.load_dict(BROWSER_DOCUMENT), here / "out" / "report.html"), \
        here / "report.png"
    probed = here / "out" / "probed.html"
    probed.write_text(page.read_text().replace("</body>", _LAYOUT_PROBE + "</body>"))
    base = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--user-data-dir=" + str(here / "profile")]
    dom = subprocess.run([*base, "--window-size=1100,1400", "--dump-dom", probed.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    seen = json.loads(html.unescape(found.group(1)))
    # Failures first, then the claims, then the phase bars, top to bottom on the screen.
    failures, claims, phases = seen["tops"]
    assert 0 < failures < phases < claims, seen["tops"]
    assert "arithmetic moved" in seen["failure"]
    # The claims table: one row per claim, its verdicts in words, a failed verdict in another colour than a held one.
    verdicts = {row[0][0]: {text: colour for text, colour in row[1:]} for row in seen["rows"]}
    assert set(verdicts) == {"bf16-true-below-16-mixed", "adam8bit-state-0.3x"}
    held, failed = verdicts["bf16-true-below-16-mixed"]["holds"], verdicts["adam8bit-state-0.3x"]["does not hold"]
    assert held != failed, verdicts
    # Each phase of the regressed case: a baseline bar and a longer one for now (+20 %), drawn to scale.
    assert {bar[0] for bar in seen["bars"]} == set(PHASES)
    widths = {phase: (before, now) for phase, before, now in seen["bars"]}
    largest = max(PHASES, key=lambda phase: PHASES[phase])
    for phase, (before, now) in widths.items():
        if phase == "load":  # 3 kB beside megabytes: drawn at the 0.5 % minimum, so visible
            assert 0 < before == now < widths[largest][0] / 100
            continue
        assert now == pytest.approx(before * 1.2, rel=0.02), (phase, before, now)
        assert before / widths[largest][0] == pytest.approx(PHASES[phase] / PHASES[largest], rel=0.02), phase
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1100,1400", "--hide-scrollbars", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1400, 1100)
    colours = {tuple(p) for p in pixels[::20, ::20, :3].reshape(-1, 3).round(2).tolist()}
    assert len(colours) > 5  # text and coloured verdicts drawn, not a blank page
