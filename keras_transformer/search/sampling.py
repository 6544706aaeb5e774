"""Sampling: each output token drawn from the model's next-token distribution, sharpened or
flattened by a temperature and cut to its `top_k` most likely tokens and to its top-p nucleus
(the smallest set of most likely tokens whose probability reaches p). The usual way to make
back-translation data, where sampled sources train better than beam search's (Edunov et al.,
2018); the options are CTranslate2's `sampling_temperature`, `sampling_topk` and
`sampling_topp`.

The random numbers are a hash of (the sentence's seed, the sample's number, the position), not
a generator's state: a sentence's samples depend on its seed alone, not on the sentences batched
with it (which TF Serving's batching chooses) nor on the order steps run in, and they are the
same under TensorFlow and JAX.
"""

import dataclasses

from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, take_per_row
from keras_transformer.search.execution import Execution
from keras_transformer.search.greedy import one_output_search
from keras_transformer.search.processors import one_value
from keras_transformer.search.settings import FLOAT32, INF, INT32, OPTIONS, Option, SearchResult, settings_with
from keras_transformer.search.top_k import token_log_probs


# How tokens are drawn, a row each (as `OPTIONS`): `SamplingSettings`' fields, the SavedModel's
# `sample` inputs and `export.translate`'s sampling flags. The defaults draw from the model's own
# distribution.
SAMPLING_OPTIONS = (
    Option("temperature", FLOAT32, 1.0, "> 0 and finite", lambda v: (v > 0) & (v < INF),
           "the logits are divided by it before the softmax: below 1 closer to greedy search, above 1 flatter", 1.5),
    Option("top_k", INT32, 0, ">= 0", lambda v: v >= 0,
           "draw among the k most likely tokens only; 0 for the whole vocabulary, 1 is greedy search", 5),
    Option("top_p", FLOAT32, 1.0, "in (0, 1]", lambda v: (v > 0) & (v <= 1),
           "draw among the most likely tokens whose probabilities (after the temperature and top k) first "
           "sum to at least p; 1 for all of them", 0.9),
)  # fmt: skip


def _check_sampling(settings):
    for option in SAMPLING_OPTIONS:
        option.check_value(getattr(settings, option.name))


SamplingSettings = dataclasses.make_dataclass(
    "SamplingSettings",
    [(option.name, option.kind.python, dataclasses.field(default=option.default)) for option in SAMPLING_OPTIONS],
    frozen=True,
    namespace={"__post_init__": _check_sampling, "__module__": __name__},
)
SamplingSettings.__doc__ = "How tokens are drawn: a field for each row of `SAMPLING_OPTIONS`, with its default."


def sample_search(model, source_ids, seed, settings=None, *, num_samples=1, temperature=SamplingSettings.temperature,
                  top_k=SamplingSettings.top_k, top_p=SamplingSettings.top_p, max_length=None, execution=None,
                  target_prefix=None, bos_id=BOS_ID, eos_id=EOS_ID, **options):  # fmt: skip
    """Translates each sentence of `source_ids` `[batch, source_len]` `num_samples` times, each
    output token drawn at random (`SamplingSettings`) from the step's log-probabilities after
    the processors the options turn on (keras_transformer/search/processors/).

    Args:
        model: a `DecodingModel` (a `Transformer`).
        source_ids: int32 `[batch, source_len]`, padded with 0.
        seed: int, or int32 `[batch]`, one per sentence: a sentence's samples are a function
            of its seed.
        settings: a `DecodingSettings` (its beam size unread; alpha for the scores only), whose
            fields `options` replace.
        num_samples: n, the outputs drawn for each sentence (independently).
        temperature, top_k, top_p: as `SamplingSettings`, each a number or `[batch]`, one per
            sentence (unchecked here: `SamplingSettings` checks numbers).
        max_length, execution, target_prefix, bos_id, eos_id: as `beam_search`'s.

    Returns:
        A `SearchResult`: tokens `[batch, n, max_length]` and scores `[batch, n]`, each the
        model's log P(Y | X) / lp(Y) after the processors (not that of the distribution drawn
        from): with bans alone, the model's own.
    """
    execution = execution or Execution.choose()
    settings = settings_with(settings, options)
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch = ops.shape(source_ids)[0]

    def per_row(values, dtype):  # [batch * n]: a sentence's n samples in adjacent rows
        return ops.repeat(ops.broadcast_to(ops.convert_to_tensor(values, dtype), (batch,)), num_samples, axis=0)

    seeds, temperatures, top_ks, top_ps = (per_row(seed, "int32"), per_row(temperature, "float32"),
                                           per_row(top_k, "int32"), per_row(top_p, "float32"))  # fmt: skip
    sample_numbers = ops.tile(ops.arange(num_samples, dtype="int32"), (batch,))  # [batch * n]

    def draw(logits, processing, step):
        seed, number, temperature, top_k, top_p = (ops.take(values, step.sentence) for values in  # [a] each
                                                   (seeds, sample_numbers, temperatures, top_ks, top_ps))  # fmt: skip
        log_probs = processing(logits, step) if processing else logits
        token = sample_tokens(log_probs, random_uniform(seed, number, step.index), temperature, top_k, top_p)  # [a]
        chosen = take_per_row(log_probs, token[:, None]) if processing else token_log_probs(logits, token)[:, None]
        return chosen, token[:, None]

    if target_prefix is not None:
        target_prefix = ops.repeat(ops.convert_to_tensor(target_prefix, "int32"), num_samples, axis=0)
    repeated = {option.name: ops.repeat(ops.convert_to_tensor(getattr(settings, option.name)), num_samples, axis=0)
                for option in OPTIONS if not one_value(getattr(settings, option.name))}  # fmt: skip
    result = one_output_search(model, ops.repeat(source_ids, num_samples, axis=0), draw,
                               dataclasses.replace(settings, **repeated), max_length=max_length, execution=execution,
                               target_prefix=target_prefix, bos_id=bos_id, eos_id=eos_id)  # fmt: skip
    length = ops.shape(result.tokens)[1]  # not -1, which an empty batch leaves undefined
    return SearchResult(ops.reshape(result.tokens, (batch, num_samples, length)), ops.reshape(result.scores, (batch, num_samples)))


def sample_tokens(logits, uniform, temperature, top_k, top_p):
    """One token per row of `logits` `[rows, vocab]`, drawn by inverting the cumulative
    distribution at `uniform` (float32 `[rows]` in [0, 1)) after the temperature, top k and top
    p of each row (`[rows]` each, as `SamplingSettings`). int32 `[rows]`."""
    vocab = ops.shape(logits)[-1]
    values, order = ops.top_k(logits / temperature[:, None], vocab)  # [rows, vocab], most likely first
    rank = ops.arange(vocab, dtype="int32")
    keep = rank < ops.where(top_k > 0, top_k, vocab)[:, None]  # [rows, vocab]
    probs = ops.softmax(ops.where(keep, values, float("-inf")), axis=-1)
    # The nucleus: every token whose better tokens hold less than top_p (the first always).
    keep = keep & ((ops.cumsum(probs, axis=-1) - probs < top_p[:, None]) | (top_p >= 1.0)[:, None])
    cumulative = ops.cumsum(ops.where(keep, probs, 0.0), axis=-1)  # [rows, vocab]
    position = ops.sum(ops.cast(cumulative <= uniform[:, None] * cumulative[:, -1:], "int32"), axis=-1)
    position = ops.minimum(position, ops.sum(ops.cast(keep, "int32"), axis=-1) - 1)  # [rows]: rounding
    return ops.cast(take_per_row(order, position[:, None])[:, 0], "int32")


def random_uniform(seed, stream, counter):
    """Float32 in [0, 1), a hash of each row's int32 `seed` and `stream` `[rows]` and an int32
    `counter` (scalar or `[rows]`), at 24 bits: equal inputs give equal numbers, and any change
    of one gives an unrelated one."""
    x = _mix(ops.cast(seed, "uint32"))
    x = _mix(ops.add(x, ops.cast(stream, "uint32")))
    x = _mix(ops.add(x, ops.cast(counter, "uint32")))
    return ops.cast(ops.right_shift(x, ops.convert_to_tensor(8, "uint32")), "float32") * 2.0**-24


def _mix(x):
    """A 32-bit integer hash (the "lowbias32" constants of Chris Wellons' hash prospector): each
    output bit depends on every input bit."""
    for shift, multiplier in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = ops.bitwise_xor(x, ops.right_shift(x, ops.convert_to_tensor(shift, "uint32")))
        x = ops.multiply(x, ops.convert_to_tensor(multiplier, "uint32"))
    return ops.bitwise_xor(x, ops.right_shift(x, ops.convert_to_tensor(16, "uint32")))
