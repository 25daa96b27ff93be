"""The round best-validation selection keeps (``fednorm.engine.validation``), on hand-written records."""

import math

from fednorm.engine.validation import best_index, client_selection, selection_fields


def _record(r: int, val: list[float | None], test: list[float]) -> dict:
    scored = [v for v in val if v is not None]
    return {"round": r, "client_val_accuracies": val, "val_accuracy": sum(scored) / len(scored) if scored else math.nan,
            "client_accuracies": test, "test_accuracy": sum(test) / len(test), "mean_client_accuracy": sum(test) / len(test)}


HISTORY = [
    _record(2, [0.2, 0.6], [0.1, 0.1]),
    _record(4, [0.8, 0.4], [0.2, 0.3]),  # mean 0.6: the first of the two best
    _record(6, [0.5, 0.7], [0.9, 0.9]),  # mean 0.6 again, best test: not selected (the code's strict >)
    _record(8, [0.1, 0.7], [0.4, 0.5]),  # client 1's tie with round 6: its first is kept
    {"round": 9, "val_accuracy": math.nan, "client_val_accuracies": [None, None], "client_accuracies": [1.0, 1.0],
     "test_accuracy": 1.0, "mean_client_accuracy": 1.0},  # NaN never wins
]


def test_best_index_is_the_first_largest_finite_value() -> None:
    assert best_index([0.1, float("nan"), 0.3, 0.3, None, True]) == 2
    assert best_index([float("nan"), None]) is None and best_index([]) is None


def test_one_round_for_all_clients_the_first_best_mean() -> None:
    out = selection_fields(HISTORY, personalized=False)
    assert out["best_val_round"] == 4 and out["best_val_accuracy"] == HISTORY[1]["val_accuracy"]
    assert out["best_val_test_accuracy"] == 0.25 and out["best_val_client_accuracies"] == [0.2, 0.3]
    assert "client_best_val_rounds" not in out


def test_each_client_at_its_own_best_round() -> None:
    assert client_selection(HISTORY) == [(4, 0.2), (6, 0.9)]
    out = selection_fields(HISTORY, personalized=True)
    assert out["client_best_val_rounds"] == [4, 6] and out["client_best_val_test_accuracies"] == [0.2, 0.9]
    assert math.isclose(out["client_best_val_mean_accuracy"], 0.55)


def test_a_run_without_validation_has_no_selection_fields() -> None:
    plain = [{"round": 1, "test_accuracy": 0.5}]
    assert selection_fields(plain, personalized=True) == {} and client_selection(plain) == []
