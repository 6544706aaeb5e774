"""The decoding options (keras_transformer/search/settings.py's OPTIONS) against brute force on a
tiny vocabulary: every output a search may return, enumerated and scored by full forward passes
with the option's rule written out here in plain Python; beam search wide enough to keep every
prefix returns the best allowed one, greedy search the step-by-step best, sampling never an
output the option forbids. Then per-sentence options in one batch, the TensorFlow graph and XLA,
and cutting long sources."""

import functools
import itertools

import numpy as np
import pytest
import tensorflow as tf

from conftest import SCORE_TOLERANCE
from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.search import OPTION, Execution, beam_search, greedy_search, sample_search
from keras_transformer.search.input_length import cut
from search_helpers import _forward, _length_penalty, _model, _never_ends, _nonzero_lengths, _sources

VOCAB = 7  # padding, unknown, begin and end of sentence, and three more
LIMIT = 4  # output tokens, the end of sentence included


def _value(hypothesis, i, log_probs, options):
    """The processed log-probability of `hypothesis[i]` after `hypothesis[:i]`, or None where an
    option bans it: each rule as its option's help states it."""
    token, before = hypothesis[i], hypothesis[:i]
    if token == EOS_ID and i < options.get("min_length", 0):
        return None
    if token == UNK_ID and options.get("disable_unk", False):
        return None
    n = options.get("no_repeat_ngram_size", 0)
    if n and i + 1 >= n:
        earlier = {tuple(before[j : j + n]) for j in range(len(before) - n + 1)}
        if tuple(hypothesis[i + 1 - n : i + 1]) in earlier:
            return None
    for sequence in options.get("suppress_sequences", ()):
        if len(sequence) <= i + 1 and tuple(hypothesis[i + 1 - len(sequence) : i + 1]) == tuple(sequence):
            return None
    value = log_probs[i][token]
    return value * options.get("repetition_penalty", 1.0) if token in before else value


def _log_probs(model, source, hypotheses, length):
    """`[len(hypotheses), length, vocab]` log-probabilities by full forward passes (padding -inf)."""
    inputs = np.zeros((len(hypotheses), length), "int32")
    for row, hypothesis in enumerate(hypotheses):
        inputs[row, : len(hypothesis)] = [BOS_ID, *hypothesis[:-1]]
    logits = np.asarray(_forward(model)(np.repeat(source[None], len(hypotheses), axis=0), inputs))
    log_probs = np.asarray(tf.nn.log_softmax(logits[..., 1:]))  # padding is never generated
    return np.concatenate([np.full(log_probs.shape[:-1] + (1,), -np.inf), log_probs], axis=-1)


@functools.cache
def _every_output(model, source_bytes, limit):
    """Every output that ends with the end of sentence within `limit` tokens or is cut at `limit`,
    and the log-probabilities of each."""
    tokens = range(1, VOCAB)
    hypotheses = [list(body) + [last] for length in range(1, limit + 1)
                  for body in itertools.product([t for t in tokens if t != EOS_ID], repeat=length - 1)
                  for last in (tokens if length == limit else [EOS_ID])]  # fmt: skip
    return hypotheses, _log_probs(model, np.frombuffer(source_bytes, "int32"), hypotheses, limit)


def _exhaustive_best(model, source, limit, alpha, options):
    """(score, output) of the best output allowed by `options` among `_every_output`."""
    hypotheses, log_probs = _every_output(model, np.asarray(source, "int32").tobytes(), limit)
    best = (-np.inf, None)
    for row, hypothesis in enumerate(hypotheses):
        values = [_value(hypothesis, i, log_probs[row], options) for i in range(len(hypothesis))]
        if None not in values:
            score = sum(values) / _length_penalty(len(hypothesis), alpha)
            best = max(best, (score, [t for t in hypothesis if t != EOS_ID]), key=lambda pair: pair[0])
    return best


def _greedy_reference(model, source, limit, alpha, options):
    """Greedy search with the rules of `_value`, one full forward pass a step."""
    hypothesis, total = [], 0.0
    while len(hypothesis) < limit and EOS_ID not in hypothesis:
        log_probs = _log_probs(model, source, [hypothesis + [0]], len(hypothesis) + 1)[0]
        values = [_value(hypothesis + [t], len(hypothesis), log_probs, options) for t in range(VOCAB)]
        values = [-np.inf if v is None else v for v in values]
        token = int(np.argmax(values))
        hypothesis.append(token)
        total += values[token]
    return total / _length_penalty(len(hypothesis), alpha), [t for t in hypothesis if t != EOS_ID]


def _outputs(result):
    return [list(row[row != PAD_ID]) for row in np.asarray(result.tokens)]


# One case per processor (and two together); each changes the best output of some sentence here.
CASES = {
    "min_length": dict(min_length=3),
    "no_repeat_ngram_size 1": dict(no_repeat_ngram_size=1),
    "no_repeat_ngram_size 2": dict(no_repeat_ngram_size=2),
    "repetition_penalty": dict(repetition_penalty=3.0),
    "disable_unk": dict(disable_unk=True),
    "suppress_sequences": dict(suppress_sequences=((4,), (1, 1), (2, 2, 2))),
    "together": dict(min_length=2, no_repeat_ngram_size=2, disable_unk=True, suppress_sequences=((5, 5),)),
}


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(5)
    return _model(VOCAB, seed=21), _sources(rng, [3, 2, 4, 3, 1, 2], VOCAB)


@pytest.mark.parametrize("case", list(CASES))
def test_a_beam_that_keeps_every_prefix_returns_the_exhaustive_best_allowed_output(case, tiny):
    model, sources = tiny
    options = CASES[case]
    changed = False
    for alpha in (0.0, 0.6):
        result = beam_search(model, sources, beam_size=(VOCAB - 1) ** (LIMIT - 1), alpha=alpha, max_length=LIMIT, **options)
        for row, source in enumerate(sources):
            score, output = _exhaustive_best(model, source, LIMIT, alpha, options)
            assert _outputs(result)[row] == output, (alpha, row)
            np.testing.assert_allclose(result.scores[row], score, rtol=1e-4)
            changed |= _exhaustive_best(model, source, LIMIT, alpha, {})[1] != output
    assert changed, "the option changed no sentence's exhaustive best: a search that ignored it would pass"


# Greedy's choice on these random models is the begin-of-sentence token (the tied embedding
# echoes the decoder's first input), which no option bans. For the options that ban the end of
# sentence or the unknown token, that token's embedding row is made the begin-of-sentence row,
# nudged: greedy then takes it, and the option binds.
FAVOURED = {"min_length": EOS_ID, "disable_unk": UNK_ID}


def _favouring(token):
    """The `tiny` fixture's model with `token` made greedy's choice."""
    model = _model(VOCAB, seed=21)
    (embeddings,) = [weight for weight in model.weights if weight.path.endswith("embeddings")]
    rows = embeddings.numpy()
    rows[token] = rows[BOS_ID] + 0.01 * np.random.default_rng(0).standard_normal(rows.shape[1])
    embeddings.assign(rows)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_search_takes_the_best_allowed_token_at_each_step_and_sampling_never_a_banned_one(case, tiny):
    model, sources = tiny
    model = _favouring(FAVOURED[case]) if case in FAVOURED else model
    options = CASES[case]
    greedy = greedy_search(model, sources, alpha=0.6, max_length=LIMIT, **options)
    changed = False
    for row, source in enumerate(sources):
        score, output = _greedy_reference(model, source, LIMIT, 0.6, options)
        assert _outputs(greedy)[row] == output, row
        np.testing.assert_allclose(greedy.scores[row], score, rtol=1e-4)
        changed |= _greedy_reference(model, source, LIMIT, 0.6, {})[1] != output
    assert changed, "the option changed no sentence's greedy output: a search that ignored it would pass"
    # Sampling draws from the processed log-probabilities: with top_k 1 it is greedy search.
    top_1 = sample_search(model, sources, 0, top_k=1, alpha=0.6, max_length=LIMIT, **options)
    np.testing.assert_array_equal(np.asarray(top_1.tokens)[:, 0], greedy.tokens)
    np.testing.assert_allclose(np.asarray(top_1.scores)[:, 0], greedy.scores, **SCORE_TOLERANCE)
    def banned(samples):
        """The outputs drawn in `samples` that `options` forbid."""
        found = []
        for row, source in enumerate(sources):
            drawn = sorted({tuple(int(t) for t in sample if t != PAD_ID) for sample in np.asarray(samples.tokens)[row]})
            assert len(drawn) > 1
            hypotheses = [list(output) + ([EOS_ID] if len(output) < LIMIT else []) for output in drawn]
            for hypothesis, log_probs in zip(hypotheses, _log_probs(model, source, hypotheses, LIMIT)):
                found += [hypothesis] if None in [_value(hypothesis, i, log_probs, options) for i in range(len(hypothesis))] else []
        return found

    seeds = np.arange(len(sources))
    assert banned(sample_search(model, sources, seeds, num_samples=20, temperature=2.0, max_length=LIMIT, **options)) == []
    if set(options) != {"repetition_penalty"}:  # the one option that forbids nothing
        unprocessed = sample_search(model, sources, seeds, num_samples=20, temperature=2.0, max_length=LIMIT)
        assert banned(unprocessed), "sampling without the option drew nothing it forbids: the check could not fail"


def test_the_length_limit_is_a_times_the_source_length_plus_b_per_sentence(rng):
    model = _never_ends(_model(30, seed=22))
    sources = _sources(rng, [5, 3, 6, 1], 30)
    lengths = np.sum(sources != PAD_ID, axis=1)
    a, b = np.array([1.0, 0.5, 2.0, 0.0], "float32"), np.array([2, 0, 1, 3], "int32")
    for search in (greedy_search, functools.partial(beam_search, width=3)):
        result = search(model, sources, max_length_a=a, max_length_b=b)
        np.testing.assert_array_equal(_nonzero_lengths(result.tokens), np.maximum(np.floor(a * lengths) + b, 1))
        alone = search(model, sources, max_length_a=1.5, max_length_b=1)
        np.testing.assert_array_equal(_nonzero_lengths(alone.tokens), np.floor(1.5 * lengths) + 1)


def _per_sentence_options(batch):
    return dict(
        beam_size=np.array([4, 1, 3, 2, 4, 4][:batch], "int32"),
        alpha=np.array([0.6, 0.0, 1.0, 0.6, 0.2, 0.6][:batch], "float32"),
        min_length=np.array([0, 3, 0, 2, 0, 1][:batch], "int32"),
        no_repeat_ngram_size=np.array([2, 0, 1, 0, 3, 0][:batch], "int32"),
        repetition_penalty=np.array([1.0, 2.0, 1.0, 1.5, 1.0, 1.0][:batch], "float32"),
        disable_unk=np.array([False, True, False, True, False, True][:batch]),
        suppress_sequences=np.array([[[4, 5], [0, 0]], [[0, 0], [0, 0]], [[6, 0], [4, 4]], [[5, 0], [0, 0]],
                                     [[0, 0], [0, 0]], [[4, 0], [5, 0]]][:batch], "int32"),  # fmt: skip
    )


@pytest.mark.slow
def test_options_that_differ_per_sentence_give_each_sentence_what_it_gets_alone(rng):
    model = _model(30, seed=23)
    sources = _sources(rng, [5, 3, 6, 2, 4, 7], 30)
    options = _per_sentence_options(len(sources))
    batched = beam_search(model, sources, width=4, max_length_b=5, **options)
    sampled = sample_search(model, sources, np.arange(6), num_samples=3, top_k=5, max_length_b=5, **options)
    for row in range(len(sources)):
        alone = {name: (tuple(map(tuple, values[row])) if name == "suppress_sequences" else values[row].item())
                 for name, values in options.items()}  # fmt: skip
        expected = beam_search(model, sources[row : row + 1], max_length_b=5, **alone)
        np.testing.assert_array_equal(np.asarray(batched.tokens[row])[: expected.tokens.shape[1]], expected.tokens[0])
        np.testing.assert_allclose(batched.scores[row], expected.scores[0], **SCORE_TOLERANCE)
        drawn = sample_search(model, sources[row : row + 1], row, num_samples=3, top_k=5, max_length_b=5, **alone)
        np.testing.assert_array_equal(np.asarray(sampled.tokens[row])[:, : drawn.tokens.shape[2]], drawn.tokens[0])
    assert len({tuple(row) for row in np.asarray(batched.tokens)}) == len(sources)


@pytest.mark.slow
def test_per_sentence_values_that_turn_nothing_on_change_nothing(rng):
    """As the `options` signature passes a request that sets no option: every processor's value a
    tensor, each step's `cond` skipping it."""
    model = _model(30, seed=23)
    sources = _sources(rng, [5, 3, 6, 2], 30)
    off = {name: np.zeros_like(values) for name, values in _per_sentence_options(len(sources)).items()
           if OPTION[name].processor is not None}  # fmt: skip
    off["repetition_penalty"] += 1.0
    result = tf.function(lambda s: beam_search(model, s, width=4, max_length_b=5, **off))(sources)
    plain = beam_search(model, sources, max_length_b=5)
    np.testing.assert_array_equal(result.tokens, plain.tokens)
    np.testing.assert_allclose(result.scores, plain.scores, **SCORE_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("search", [greedy_search, functools.partial(beam_search, width=4)], ids=["greedy", "beam"])
@pytest.mark.parametrize("xla", [False, True], ids=["graph", "XLA"])
def test_xla_and_the_graph_process_as_eager_does(search, xla, rng):
    model = _model(30, seed=24)
    sources = _sources(rng, [5, 3, 6, 2, 4, 7], 30)
    options = _per_sentence_options(len(sources))
    if search is greedy_search:
        del options["beam_size"]
    eager = search(model, sources, max_length_b=5, **options)
    result = tf.function(lambda s: search(model, s, max_length_b=5, execution=Execution.choose(compiled=xla), **options),
                         jit_compile=xla)(sources)  # fmt: skip
    np.testing.assert_array_equal(result.tokens, eager.tokens)
    np.testing.assert_allclose(result.scores, eager.scores, **SCORE_TOLERANCE)
    plain = search(model, sources, max_length_b=5)
    assert not np.array_equal(plain.tokens, eager.tokens)


def test_long_sources_are_cut_to_max_input_length_and_reported(rng):
    model = _model(30, seed=25)
    sources = _sources(rng, [6, 3, 8, 1], 30)
    sources[np.arange(4), np.sum(sources != PAD_ID, axis=1) - 1] = EOS_ID
    limits = np.array([4, 4, 0, 1], "int32")  # 0: no limit
    ids, was_cut = (np.asarray(x) for x in cut(sources, limits))
    np.testing.assert_array_equal(was_cut, [True, False, False, False])
    np.testing.assert_array_equal(ids[0], [*sources[0, :3], EOS_ID, 0, 0, 0, 0])
    np.testing.assert_array_equal(ids[1:], sources[1:])
    np.testing.assert_array_equal(np.asarray(cut(sources, 1)[0])[:, 0], [EOS_ID] * 4)  # the end of sentence alone
    for search in (greedy_search, beam_search):
        result = search(model, sources, max_input_length=limits, max_length_b=2)
        expected = search(model, ids, max_length_b=2)
        np.testing.assert_array_equal(result.tokens, expected.tokens)
        np.testing.assert_allclose(result.scores, expected.scores, rtol=1e-6)


def test_a_no_repeat_ngram_size_beyond_the_output_costs_what_the_longest_that_binds_does(rng, monkeypatch):
    """A request may send any size: at step `index`, the loop over an n-gram's tokens runs at most
    `index - 1` times (an n above `index` completes nothing yet), and such an n bans nothing."""
    from keras import ops

    from keras_transformer.search.processors import Step, no_repeat_ngram

    tokens = np.concatenate([np.full((3, 1), BOS_ID), rng.integers(4, 7, size=(3, 9))], axis=1).astype("int32")
    log_probs = np.log(np.full((3, VOCAB), 1 / VOCAB, "float32"))
    fori_loop = ops.fori_loop

    def bounded(lower, upper, *args):  # refuses before a long loop starts
        assert int(upper) <= index - 1 or int(upper) <= 0, (index, int(upper))
        return fori_loop(lower, upper, *args)

    monkeypatch.setattr(ops, "fori_loop", bounded)
    for index in range(10):
        step = Step(index, tokens, np.arange(3), None)
        for size in (10**6, np.array([0, 10**6, 2], "int32")):
            processed = np.asarray(no_repeat_ngram.process(log_probs, step, size))
            expected = np.asarray(no_repeat_ngram.process(log_probs, step, np.minimum(size, index + 1)))
            np.testing.assert_array_equal(processed, expected)
        np.testing.assert_array_equal(np.asarray(no_repeat_ngram.process(log_probs, step, 10**6)), log_probs)
