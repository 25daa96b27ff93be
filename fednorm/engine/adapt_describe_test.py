"""``AdaptResult.describe``: the line a person reads shows accuracies in percent, while
``summary()`` (written to ``adapt-*.json``) keeps them as fractions."""

from __future__ import annotations

import math

from fednorm.engine.adapt import AdaptResult


def test_describe_prints_percent_and_summary_keeps_fractions() -> None:
    res = AdaptResult(accuracy=0.8125, accuracy_averaged_stats=0.5, num_stat_samples=16, num_test=4, source="domain:c", method="fedbn")
    line = res.describe()
    assert "81.25%" in line and "50.00%" in line and "0.8125" not in line and "domain:c" in line
    assert res.summary()["accuracy"] == 0.8125 and res.summary()["accuracy_averaged_stats"] == 0.5
    empty = AdaptResult(accuracy=math.nan, accuracy_averaged_stats=math.nan, num_stat_samples=16, num_test=0, source="client:1",
                        method="fedbn")
    assert "n/a" in empty.describe() and "nan" not in empty.describe()
