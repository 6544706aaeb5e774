import keras
import numpy as np
import pytest

from training.loss import smoothed_cross_entropy
from training.schedule import TransformerSchedule, paper_optimizer


@pytest.mark.parametrize("step_num", [1, 4000, 100000])
def test_schedule_is_the_formula_of_section_5_3(step_num):
    expected = 512**-0.5 * min(step_num**-0.5, step_num * 4000**-1.5)
    # Keras passes the optimizer's iterations, which count from 0.
    assert float(TransformerSchedule(512, 4000)(step_num - 1)) == pytest.approx(expected, rel=1e-6)


def test_schedule_peaks_at_warmup_and_round_trips():
    schedule = TransformerSchedule(256, 100, scale=2.0)
    rates = [float(schedule(i)) for i in range(300)]
    assert int(np.argmax(rates)) == 99
    clone = TransformerSchedule.from_config(schedule.get_config())
    assert float(clone(57)) == float(schedule(57))


def test_optimizer_has_the_paper_settings():
    optimizer = paper_optimizer(TransformerSchedule(512))
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def _brute_force(labels, logits, smoothing):
    total, count = 0.0, 0
    vocab = logits.shape[-1]
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] == 0:
                continue
            log_p = logits[b, t] - np.log(np.sum(np.exp(logits[b, t])))
            target = np.full(vocab, smoothing / vocab)
            target[labels[b, t]] += 1 - smoothing
            total += -np.sum(target * log_p)
            count += 1
    return total, count


def test_smoothed_loss_equals_brute_force_and_ignores_padding(rng):
    labels = np.array([[5, 3, 0, 0], [1, 2, 7, 4]])
    logits = rng.normal(size=(2, 4, 9)).astype("float32")
    loss, count = smoothed_cross_entropy(labels, logits, 0.1)
    expected, expected_count = _brute_force(labels, logits, 0.1)
    assert float(count) == expected_count == 6
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    # Whatever the logits at padded positions are, nothing changes.
    changed = logits.copy()
    changed[0, 2:] = 100.0
    np.testing.assert_allclose(float(smoothed_cross_entropy(labels, changed, 0.1)[0]), float(loss), rtol=1e-6)


def test_smoothed_loss_equals_keras_categorical_crossentropy(rng):
    labels = rng.integers(1, 9, size=(3, 5))
    logits = rng.normal(size=(3, 5, 9)).astype("float32")
    reference = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1, reduction="sum")
    expected = reference(keras.ops.one_hot(labels, 9), logits)
    np.testing.assert_allclose(float(smoothed_cross_entropy(labels, logits, 0.1)[0]), float(expected), rtol=1e-5)
