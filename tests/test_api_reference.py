"""The API reference's pages render their docstrings as written, and the examples in them run
(issue 47.6): no raw reST (``from_datasets``' page showed ````torch.utils.data.Dataset````s
verbatim, an inline literal glued to a letter), and the ``Example:`` sections of the tools on a
finished run execute as doctests, in order, in a fresh folder."""

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
