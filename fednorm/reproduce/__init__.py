"""Reproduce the papers' tables: shipped table configs, cached and resumable runs, a report.

``fednorm reproduce <paper>`` (:mod:`fednorm.cli.reproduce`) is the command; this package is its
library:

* :mod:`.suite` reads ``configs/reproduce/<paper>/<table>.yaml`` (the paper's setting at full
  scale, a stated reduced scale, rows, columns and the paper's numbers) into :class:`Table`;
* :mod:`.runner` plans one run per (cell, seed), skips finished runs, resumes interrupted ones
  and spreads runs over processes;
* :mod:`.report` reads the run directories back into ``report.md``, ``results.json`` and plots;
* :mod:`.subset` writes the class-balanced data subsets of reduced scales.

Example::

    from fednorm.reproduce import load_paper, plan, collect, write_report
    tables = load_paper("hbn")
    specs = plan(tables, scale="reduced", out="reproduce/hbn/reduced")
"""

from .report import collect, write_report
from .runner import RunSpec, plan, run_state
from .schedule import run_all
from .suite import PAPERS, SCALES, Table, list_tables, load_paper, load_table, validate_table

__all__ = ["PAPERS", "SCALES", "Table", "RunSpec", "list_tables", "load_paper", "load_table", "validate_table", "plan",
           "run_state", "run_all", "collect", "write_report"]
