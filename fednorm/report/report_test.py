"""fednorm report: run directories of any origin grouped into variants, mean ± std checked
against an independent computation, labels short and unique over runs of different settings,
and the HTML page loaded in a real headless Chromium (skipped without one: Debian's
``chromium-headless-shell`` or ``chromium`` package provides it), which must fit the window."""

from __future__ import annotations

import html
import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from fednorm.api import run
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.report import build_report

FINALS = {"fedavg": {0: 0.61, 1: 0.65, 2: 0.70}, "fedbn": {0: 0.72, 1: 0.71, 2: 0.77}}
SOURCES = ["mnist", "usps", "mnist", "usps"]


def _client_accs(method: str, seed: int) -> list[float]:
    base = FINALS[method][seed]
    return [base - 0.05, base + 0.1, base + 0.01, base + 0.04]


def _fake_run(d: Path, method: str, seed: int, status: str = "completed", **settings: object) -> None:
    """A run directory as ``fednorm run`` writes it; ``settings`` go into its config unchecked."""
    d.mkdir(parents=True)
    cfg = ExperimentConfig(method=method, norm="bn", dataset="digits", num_clients=4, rounds=3, seed=seed, out=str(d))
    (d / "config.yaml").write_text(yaml.safe_dump({**cfg.model_dump(mode="json"), **settings}, sort_keys=False))
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
    """A headless Chromium: Debian's ``chromium-headless-shell`` first (the same layout engine as
    the browser, a quarter of its start-up), else a full browser run with ``--headless``."""
    names = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome")
    return next((p for p in map(shutil.which, names) if p), None)


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
    assert '<td class="label">fedavg+bn</td>' in table and '<td class="label">fedbn+bn</td>' in table


def test_variant_labels_name_only_the_settings_that_differ_between_all_variants() -> None:
    from fednorm.report.collect import _labels

    base = ExperimentConfig(lr=0.01).model_dump(mode="json")
    configs = [{**base, "alpha": 0.1}, {**base, "alpha": 0.3},
               {**base, "method": "fbn", "norm": "fbn", "alpha": 0.1, "method_args": {"mode": "literal"}},
               {**base, "method": "fbn", "norm": "fbn", "alpha": 0.1, "method_args": {"mode": "exact"}, "seed": 5}]
    # alpha differs between the variants, so every label names it; lr is common; the seed is no setting
    assert _labels(configs) == ["fedavg+bn (alpha=0.1)", "fedavg+bn (alpha=0.3)", "fbn+fbn (alpha=0.1, method_args.mode=literal)",
                                "fbn+fbn (alpha=0.1, method_args.mode=exact)"]


def test_a_run_recorded_before_a_setting_existed_is_the_same_variant() -> None:
    """A config without a field (written by an older fednorm) has that field's default: it joins
    the variant of the same settings and adds no ``field=None`` to any label."""
    from fednorm.report.collect import Run, describe_variants, group_runs

    full = ExperimentConfig(method="fedbn", lr=0.05).model_dump(mode="json")
    old = {k: v for k, v in full.items() if k not in ("affine", "buffers", "dp_noise", "eval_compile", "attack_args")}
    other = {**full, "lr": 0.01}
    runs = [Run(Path(f"r{i}"), c, {"status": "completed", "final_test_accuracy": 0.5}, []) for i, c in enumerate([full, old, other])]
    variants = group_runs(runs)
    assert [(v.label, len(v.runs)) for v in variants] == [("fedbn+bn (lr=0.05)", 2), ("fedbn+bn (lr=0.01)", 1)]
    assert describe_variants([full, old, other]).common["affine"] == "null"


def _labels_of(md: str) -> list[str]:
    """The variant column of report.md's results table."""
    table = md.split("## Results")[1].split("\n## ")[0]
    return [line.split(" | ")[0][2:] for line in table.splitlines() if line.startswith("| ") and not line.startswith("| variant")]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three real runs (digits, 2 rounds) of different settings: lr 0.05 and 0.01 with BN, lr 0.05 with GN."""
    root = tmp_path_factory.mktemp("real")
    dirs = []
    for name, settings in (("bn-lr0.05", dict(norm="bn", lr=0.05)), ("bn-lr0.01", dict(norm="bn", lr=0.01)),
                           ("gn-lr0.05", dict(norm="gn", lr=0.05))):
        run(dict(dataset="digits", num_clients=3, rounds=2, batch_size=32, threads=1, **settings), out=str(root / name), progress=False)
        dirs.append(root / name)
    return dirs


def test_report_over_runs_of_different_settings_labels_what_differs_and_lists_the_rest_once(real_runs: list[Path], tmp_path: Path) -> None:
    from fednorm.report.collect import MAX_LABEL

    configs = [yaml.safe_load((d / "config.yaml").read_text()) for d in real_runs]
    assert min(map(len, configs)) >= 40  # a real run records every setting
    rep = build_report(real_runs, tmp_path / "rep")
    labels = ["fedavg+bn (lr=0.05)", "fedavg+bn (lr=0.01)", "fedavg+gn (lr=0.05)"]
    assert [v.label for v in rep.variants] == labels and all(len(label) <= MAX_LABEL for label in labels)
    md = rep.markdown.read_text()
    assert _labels_of(md) == labels
    common = md.split("## Common settings")[1].split("\n## ")[0]
    for setting in ("dataset=digits", "rounds=2", "num_clients=3", "batch_size=32", "method=fedavg"):
        assert f"`{setting}`" in common
    assert "`lr=" not in common and "`norm=" not in common and "`seed=" not in common
    assert "## Variant settings" not in md  # every label names all that differs: nothing more to list
    page = rep.html.read_text()
    assert page.count("<table") == page.count('<div class="table-wrap"><table') == 2  # every table in its container
    assert ".table-wrap { max-width: 100%; overflow-x: auto; }" in page
    assert '<ul class="settings" id="common">' in page and "<code>dataset=digits</code>" in page


def _wide_sweep(root: Path) -> list[dict[str, object]]:
    """Twelve variants (two seeds each) that differ in ten settings, some with long values: runs
    of several papers' suites in one report, the case of 800-character labels."""
    settings = []
    for i in range(12):
        s = dict(lr=round(0.01 * (i % 4 + 1), 3), alpha=[0.1, 0.5, 1.0][i % 3], batch_size=[4, 32][i % 2], rounds=[2, 3, 4][i % 3],
                 momentum=[0.0, 0.9][i // 6], weight_decay=[0.0, 1e-4][(i // 3) % 2], local_epochs=1 + i % 2,
                 lr_milestones=[100 * i + k for k in range(12)], partition_args={"mode": f"a-long-partition-mode-name-{i % 5}"},
                 model=["simple_cnn", "fedbn_cnn"][(i // 2) % 2])
        settings.append(s)
        for seed in (0, 1):
            _fake_run(root / f"v{i}" / f"seed{seed}", ["fedavg", "fedbn"][i % 2], seed, **s)
    return settings


def test_labels_stay_short_and_unique_when_many_settings_differ(tmp_path: Path) -> None:
    from fednorm.report.collect import MAX_LABEL_CUT

    settings = _wide_sweep(tmp_path / "sweep")
    rep = build_report([tmp_path / "sweep"], tmp_path / "rep")
    labels = [v.label for v in rep.variants]
    assert len(rep.variants) == 12 and all(len(v.runs) == 2 for v in rep.variants)
    assert len(set(labels)) == 12 and max(map(len, labels)) <= MAX_LABEL_CUT, labels
    md = rep.markdown.read_text()
    assert _labels_of(md) == labels
    # the labels name only some differing settings; the variant settings table has each in full
    table = md.split("## Variant settings")[1].split("\n## ")[0]
    usual = table.split("the usual values: ")[1].split("\n")[0]
    for v in rep.variants:
        s = settings[int(v.runs[0].dir.parent.name[1:])]  # the runs of variant i are under v<i>/
        row = next(line for line in table.splitlines() if line.startswith(f"| {v.label} |"))
        for key, value in (("lr_milestones", str(s["lr_milestones"])), ("partition_args.mode", s["partition_args"]["mode"])):
            assert f"{key}={value}" in row or f"{key}={value}" in usual
    assert "`dataset=digits`" in md.split("## Common settings")[1]


def _probe_width(browser: str, page: Path, tmp_path: Path, width: int, height: int = 800) -> dict[str, object]:
    """Load ``page`` in headless Chromium with a ``width`` x ``height`` window and read back, through
    the title of the dumped DOM, the page's scroll width and the element that reaches furthest
    right (its right edge, tag and class): a copy of the page carries the probe script."""
    probe = tmp_path / f"probe{width}.html"
    script = ("<script>window.addEventListener('load', () => { const vw = document.documentElement.clientWidth; let far = 0, who = '';"
              " for (const el of document.body.querySelectorAll('*')) { const r = el.getBoundingClientRect();"
              " if (r.right > far) { far = r.right; who = el.tagName + '.' + (el.className || '-'); } }"
              " document.title = JSON.stringify({viewport: vw, scroll: document.documentElement.scrollWidth, right: far, element: who}); });"
              "</script>")
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", proc.stdout, re.S)
    assert title is not None and title.group(1).startswith("{"), proc.stdout[:500]
    return json.loads(html.unescape(title.group(1)))


def test_report_html_fits_the_window_in_headless_chromium(real_runs: list[Path], tmp_path: Path) -> None:
    """In a window 1280 or 800 px wide no element of the page (tables included) reaches past the
    window, for three real runs and for twelve variants of ten differing settings; at 400 px the
    page itself still never scrolls sideways. A screenshot of each at 1280x800 is kept beside it."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (apt-get install chromium-headless-shell)")
    _wide_sweep(tmp_path / "sweep")
    for name, paths in (("real", real_runs), ("wide", [tmp_path / "sweep"])):
        rep = build_report(paths, tmp_path / name)
        for width in (1280, 800, 400):
            got = _probe_width(browser, rep.html, tmp_path, width)
            assert got["viewport"] == width and got["scroll"] <= width, (name, got)  # the page never scrolls sideways
            if width >= 800:  # and nothing in it needs to (at 400 px a table of 9 columns may scroll in its container)
                assert got["right"] <= width, (name, got)
        shot = tmp_path / name / "screenshot.png"
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,800",
                               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", rep.html.as_uri()],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr[-2000:]
        assert int.from_bytes(shot.read_bytes()[16:20], "big") == 1280  # the PNG header's width


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
