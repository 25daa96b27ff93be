"""fednorm list methods --verbose: each method's first sentence, whole."""

from __future__ import annotations

from fednorm.methods.registry import describe_methods, first_sentence


def test_first_sentence_does_not_stop_at_abbreviations_or_citations():
    assert first_sentence("Exact aggregation (Eq. 9–10), optionally robust. More.") == "Exact aggregation (Eq. 9–10), optionally robust."
    assert first_sentence("As in Li et al. 2021 and Sec. 3. Then more.") == "As in Li et al. 2021 and Sec. 3."
    assert first_sentence("One. Two.") == "One."
    assert first_sentence("No full stop") == "No full stop."


def test_every_registered_methods_description_is_a_whole_sentence():
    lines = [line for line in describe_methods() if not line.startswith(" ")]
    assert len(lines) >= 8
    for line in lines:
        assert line.rstrip().endswith((".", ".)")), line
        assert not line.rstrip().endswith(("Eq.", "Sec.", "al.", "(Eq.")), line
