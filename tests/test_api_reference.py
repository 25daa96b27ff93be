"""The API reference's pages render their docstrings as written, and the examples in them run
(issue 47.6): no raw reST (``from_datasets``' page showed ````torch.utils.data.Dataset````s
verbatim, an inline literal glued to a letter), and the ``Example:`` sections execute as doctests
in a fresh folder: the tools on a finished run (in order), and ``fednorm.run``, ``fednorm.compare``,
``FederatedData.from_tensors`` / ``from_datasets`` and ``fednorm.flower.MethodStrategy``, each of
which also documents what it returns and raises (the ``summary`` keys of a run among them)."""

from __future__ import annotations

import doctest
import inspect
import warnings

import pytest

import fednorm
from fednorm.data import FederatedData


def rendered(obj: object) -> str:
    """``obj``'s docstring as the reference renders it (napoleon, then docutils), as plain text."""
    import docutils.core
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    text = str(GoogleDocstring(inspect.cleandoc(obj.__doc__ or "")))
    tree = docutils.core.publish_doctree(text, settings_overrides={"report_level": 5})
    return tree.astext()


@pytest.mark.parametrize("obj", [FederatedData.from_tensors, FederatedData.from_datasets, fednorm.run, fednorm.compare,
                                 fednorm.evaluate, fednorm.diagnose, fednorm.analyze, fednorm.RunResult.client_model],
                         ids=lambda o: o.__qualname__)
def test_docstring_renders_without_raw_markup(obj):
    text = rendered(obj)
    assert "``" not in text, f"{obj.__qualname__}: raw reST in the rendered page: ...{text[text.index('``') - 60:][:140]}..."


def test_the_tools_examples_run(tmp_path, monkeypatch):
    """fednorm.evaluate's example, then diagnose's and analyze's, which continue it."""
    from fednorm.api import tools

    monkeypatch.chdir(tmp_path)
    globs = {"fednorm": fednorm}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    finder = doctest.DocTestFinder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("evaluate", "diagnose", "analyze"):
            for test in finder.find(getattr(tools, name), name, globs=globs):
                test.globs = globs
                runner.run(test, clear_globs=False)
    results = runner.summarize(verbose=False)
    assert results.failed == 0 and results.attempted >= 10


def _run_examples(objects: dict[str, object], globs: dict[str, object]) -> doctest.TestResults:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    finder = doctest.DocTestFinder(recurse=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, obj in objects.items():
            tests = finder.find(obj, name, globs=globs)
            assert tests and tests[0].examples, f"{name} has no example"
            for test in tests:
                runner.run(test, clear_globs=False)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("obj, sections", [
    (fednorm.run, ("Returns:", "Raises:", "Example:", "overwrite:", "client_weighting", "train_loss_exploded",
                   "final_mean_client_accuracy", "status")),
    (fednorm.compare, ("Returns:", "Raises:", "Example:", "overwrite:")),
    (FederatedData.from_tensors, ("Returns:", "Raises:", "Example:")),
    (FederatedData.from_datasets, ("Returns:", "Raises:", "Example:")),
], ids=lambda o: getattr(o, "__qualname__", ""))
def test_the_reference_says_what_each_entry_returns_and_raises(obj, sections):
    doc = obj.__doc__ or ""
    assert all(s in doc for s in sections), [s for s in sections if s not in doc]


def test_the_run_and_data_examples_run(tmp_path, monkeypatch):
    """Each example in a fresh folder: one round, a few samples."""
    monkeypatch.chdir(tmp_path)
    results = _run_examples({"run": fednorm.run, "compare": fednorm.compare, "from_tensors": FederatedData.from_tensors,
                             "from_datasets": FederatedData.from_datasets}, {"fednorm": fednorm})
    assert results.failed == 0 and results.attempted >= 20


def test_the_method_strategy_example_runs_and_its_reference_renders():
    pytest.importorskip("flwr", reason="the Flower extra (flwr) is not installed")
    from fednorm.flower import MethodStrategy

    doc = MethodStrategy.__doc__ or ""
    assert all(s in doc for s in ("Returns:", "Raises:", "Example:")) and "``" not in rendered(MethodStrategy)
    results = _run_examples({"MethodStrategy": MethodStrategy}, {})
    assert results.failed == 0 and results.attempted >= 4
