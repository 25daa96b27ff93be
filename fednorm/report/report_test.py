"""fednorm report: run directories of any origin grouped into variants, mean ± std checked
against an independent computation, and the HTML page loaded in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from fednorm.api import run
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.report import build_report

FINALS = {"fedavg": {0: 0.61, 1: 0.65, 2: 0.70}, "fedbn": {0: 0.72, 1: 0.71, 2: 0.77}}
SOURCES = ["mnist", "usps", "mnist", "usps"]


def _client_accs(method: str, seed: int) -> list[float]:
    base = FINALS[method][seed]
    return [base - 0.05, base + 0.1, base + 0.01, base + 0.04]


def _fake_run(d: Path, method: str, seed: int, status: str = "completed") -> None:
    d.mkdir(parents=True)
    cfg = ExperimentConfig(method=method, norm="bn", dataset="digits", num_clients=4, rounds=3, seed=seed, out=str(d))
    (d / "config.yaml").write_text(cfg.to_yaml())
    final = FINALS[method][seed]
    hist = [{"round": r, "test_accuracy": final * r / 3, "test_loss": 1.0, "train_loss": 1.0} for r in (1, 2, 3)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in hist))
    summary = {"status": status, "method": method, "seed": seed, "rounds": 3, "final_test_accuracy": final,
               "best_test_accuracy": final, "last10_mean_test_accuracy": statistics.fmean(h["test_accuracy"] for h in hist),
               "final_mean_client_accuracy": statistics.fmean(_client_accs(method, seed)), "final_test_loss": 1.0,
               "final_client_accuracies": _client_accs(method, seed), "client_sources": SOURCES, "wall_seconds": 2.0}
    (d / "summary.json").write_text(json.dumps(summary))
    counts = [[5 + seed, 0, 3], [0, 4, 4], [2, 2, 2], [1, 0, 7]]
    (d / "partition.json").write_text(json.dumps({"dataset": "digits", "partition": "dirichlet", "num_clients": 4, "seed": seed,
                                                  "num_classes": 3, "train_label_counts": counts, "client_sources": SOURCES}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for method in FINALS:
        for seed in (0, 1, 2):
            _fake_run(root / method / f"seed{seed}", method, seed)
    _fake_run(root / "fedbn" / "seed9", "fedbn", 0, status="interrupted")  # not in the statistics
    (root / "fedbn" / "seed9" / "config.yaml").write_text(
        ExperimentConfig(method="fedbn", norm="bn", dataset="digits", num_clients=4, rounds=3, seed=9).to_yaml())
    return root


def test_report_groups_seeds_into_variants_with_mean_and_std(sweep: Path, tmp_path: Path) -> None:
    rep = build_report([sweep], tmp_path / "rep")
    assert [v.label for v in rep.variants] == ["fedavg+bn", "fedbn+bn"]
    md = rep.markdown.read_text()
    for method, runs in (("fedavg", "3/3"), ("fedbn", "3/4")):
        vals = list(FINALS[method].values())
        cell = f"{100 * statistics.fmean(vals):.2f} ± {100 * statistics.stdev(vals):.2f}"
        row = next(line for line in md.splitlines() if line.startswith(f"| {method}+bn |"))
        assert cell in row and f"| {runs} |" in row
        for src in ("mnist", "usps"):  # per source: the mean of its clients' accuracies, then over seeds
            per_seed = [statistics.fmean(a for a, s in zip(_client_accs(method, k), SOURCES) if s == src) for k in (0, 1, 2)]
            want = f"{100 * statistics.fmean(per_seed):.2f} ± {100 * statistics.stdev(per_seed):.2f}"
            dom = next(line for line in md.split("## Final accuracy per data source")[1].splitlines() if line.startswith(f"| {method}+bn"))
            assert want in dom
    assert "| fedbn+bn | 9 | interrupted |" in md
    assert {p.name for p in rep.figures} == {"curves_0.png", "domains.png", "partition_0.png", "partition_1.png", "partition_2.png"}
    page = rep.html.read_text()
    assert page.count("data:image/png;base64,") == 5
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)  # self-contained: nothing to fetch


def test_report_cli_and_its_errors(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(sweep / "fedavg"), str(sweep / "fedbn"), "--out", str(tmp_path / "r")]) == 0
    assert "7 run(s) in 2 variant(s)" in capsys.readouterr().out
    assert main(["report", str(sweep / "fedavg")]) == 0 and (sweep / "fedavg" / "report" / "report.html").is_file()
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no run directory" in capsys.readouterr().err
    assert main(["report", str(sweep / "fedavg"), str(sweep / "fedbn")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_run_records_its_partition(tmp_path: Path) -> None:
    res = run(dict(dataset="digits", num_clients=3, rounds=1, batch_size=32, threads=1), out=str(tmp_path / "r"), progress=False)
    rec = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert rec["train_label_counts"] == res.simulation.data.histogram().tolist()
    assert rec["num_classes"] == 10 and rec["seed"] == 0 and rec["client_sources"] is None


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p), None)


def test_report_html_loads_in_headless_chromium_without_console_errors(sweep: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary")
    rep = build_report([sweep], tmp_path / "rep")
    # A copy with a probe that reports, through the console, whether every inlined figure decoded.
    probe = tmp_path / "probe.html"
    script = ("<script>window.addEventListener('load', () => { const imgs = [...document.images]; "
              "console.log('PROBE ' + imgs.length + ' ' + imgs.filter(i => i.complete && i.naturalWidth > 0).length); });</script>")
    probe.write_text(rep.html.read_text().replace("</body>", script + "</body>"))
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom",
                           probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert len(console) == 1 and '"PROBE 5 5"' in console[0], console  # only the probe spoke: no errors, 5 of 5 images decoded
    dom = proc.stdout
    table = dom.split('<table id="results">')[1].split("</table>")[0]
    assert "<td>fedavg+bn</td>" in table and "<td>fedbn+bn</td>" in table


def test_variant_labels_name_only_what_tells_a_method_and_norms_variants_apart() -> None:
    from fednorm.report.collect import _labels

    base = ExperimentConfig().model_dump(mode="json")
    configs = [{**base, "alpha": 0.1, "lr": 0.01}, {**base, "alpha": 0.3, "lr": 0.01},
               {**base, "method": "fbn", "norm": "fbn", "alpha": 0.1, "method_args": {"mode": "literal"}},
               {**base, "method": "fbn", "norm": "fbn", "alpha": 0.1, "method_args": {"mode": "exact"}, "seed": 5}]
    assert _labels(configs) == ["fedavg+bn (alpha=0.1)", "fedavg+bn (alpha=0.3)", "fbn+fbn (method_args.mode=literal)",
                                "fbn+fbn (method_args.mode=exact)"]


def test_report_compares_the_runs_diagnostics(tmp_path):
    """Runs with --diagnostics get a diagnostics figure; its curves are each variant's mean over
    seeds, layer metrics averaged over layers (checked against a direct computation)."""
    from fednorm.report.collect import find_runs, group_runs
    from fednorm.report.figures import diagnostic_curves

    def diag(method: str, seed: int, r: int) -> dict[str, float]:
        base = 0.1 * seed + (0.5 if method == "fedbn" else 0.0)
        return {"diag/grad/cosine": base + 0.01 * r, "diag/stats/agg_mean_shift/a": base, "diag/stats/agg_mean_shift/b": 3 * base + r}

    for method in FINALS:
        for seed in (0, 1, 2):
            d = tmp_path / method / f"seed{seed}"
            _fake_run(d, method, seed)
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            rows = [{**row, **diag(method, seed, row["round"])} if row["round"] >= 2 else row for row in rows]
            (d / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    variants = group_runs(find_runs([tmp_path]))
    curves = diagnostic_curves(variants)
    assert curves["diag/acc/gap"] == []  # not recorded: no panel
    for key, value in (("diag/grad/cosine", lambda m, s, r: diag(m, s, r)["diag/grad/cosine"]),
                       ("diag/stats/agg_mean_shift/", lambda m, s, r: (diag(m, s, r)["diag/stats/agg_mean_shift/a"]
                                                                        + diag(m, s, r)["diag/stats/agg_mean_shift/b"]) / 2)):
        got = {label: (rounds, values) for label, rounds, values in curves[key]}
        assert len(got) == 2
        for v in variants:
            method = v.config["method"]
            rounds, values = got[v.label]
            assert rounds == [2, 3]
            assert values == pytest.approx([statistics.fmean(value(method, s, r) for s in (0, 1, 2)) for r in (2, 3)])
    rep = build_report([tmp_path], tmp_path / "rep")
    assert (tmp_path / "rep" / "diagnostics.png") in rep.figures
    assert "diagnostics.png" in rep.markdown.read_text()
