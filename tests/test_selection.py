"""Model selection by dev BLEU (training/selection.py) on scripted evaluations."""

from training.selection import Selection


def _run(selection, bleus):
    """Feeds `bleus` (one an evaluation, every 2 steps) until the rule stops; returns the steps
    of each new best and the step it stopped at (None: it did not)."""
    best = []
    for index, bleu in enumerate(bleus):
        if selection.update(2 * (index + 1), bleu):
            best.append(2 * (index + 1))
        if selection.stop:
            return best, 2 * (index + 1)
    return best, None


def test_early_stopping_ends_after_patience_evaluations_without_an_improvement_of_min_delta():
    # 10.3 and 10.9 gain less than 0.5 on the best; 11.1 gains exactly 0.5, which counts.
    assert _run(Selection(patience=2, min_delta=0.5), [10.0, 10.3, 10.6, 10.9, 11.1, 11.2, 10.0, 12.0]) == ([2, 6, 10], 14)
    assert _run(Selection(patience=2, min_delta=0.5), [10.0, 10.3, 10.6, 10.9, 10.5]) == ([2, 6], 10)
    # Without min_delta any gain counts, and a tie does not.
    assert _run(Selection(patience=2), [10.0, 10.3, 10.3, 10.31, 10.0, 10.31]) == ([2, 4, 8], 12)
    # Without patience it never stops, and still follows the best.
    assert _run(Selection(), [5.0, 4.0, 3.0, 6.0, 1.0, 0.0]) == ([2, 8], None)


def test_a_resumed_selection_goes_on_counting_from_its_record():
    first = Selection(patience=3)
    assert _run(first, [10.0, 9.0, 9.5]) == ([2], None)
    resumed = Selection(patience=3, **first.record())
    assert (resumed.bleu, resumed.step, resumed.since) == (10.0, 2, 2)
    assert resumed.update(8, 9.9) is False and resumed.stop
