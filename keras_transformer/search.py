"""Greedy and beam search over a trained `Transformer`, batched, with the decoder's key/value cache.

The encoder runs once; the decoder advances one position per step from its cache (see
`DecoderLayer`), which the model creates, writes and reorders: the search never looks inside it.
Written in `keras.ops`, so it runs under TensorFlow (a plain `tf.function`, as the exported
SavedModel runs it, or compiled with XLA) and under JAX (`jax.jit`). Every loop variable keeps its
shape from step to step, as XLA and TPUs need.

Decoding settings follow the paper (`hyperparameters.md`): beam 4, length penalty
`lp(Y) = ((5 + |Y|) / 6) ** alpha` with alpha 0.6, at most `source length + 50` output tokens,
early termination. |Y| counts the output tokens including the end-of-sentence token. The padding
id is never generated.
"""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9

SearchResult = collections.namedtuple("SearchResult", ["tokens", "scores"])
SearchResult.__doc__ = """Output of `greedy_search` and `beam_search`.

tokens: int32 `[batch, max_length]` (or `[batch, n, max_length]` for n-best), the output tokens
    without begin- and end-of-sentence ids, padded with 0.
scores: float32 `[batch]` (or `[batch, n]`), log P(Y | X) / lp(Y).
"""


def length_penalty(length, alpha):
    """`((5 + length) / 6) ** alpha` (GNMT; the paper's decoding, alpha = 0.6)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def greedy_search(
    model, source_ids, *, alpha=0.6, max_extra_length=50, max_length=None, bos_id=BOS_ID, eos_id=EOS_ID
):
    """Translates `source_ids` `[batch, source_len]` by taking the most likely token each step.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, padded with 0.
        alpha: length penalty exponent, for the returned score only.
        max_extra_length: each output has at most its source's length + this many tokens.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult` with tokens `[batch, max_length]` and scores `[batch]`.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    encoder_output, source_mask = model.encode(source_ids, training=False)
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    batch = ops.shape(source_ids)[0]

    def step(index, tokens, log_prob, length, done, cache):
        logits, cache = model.decode_step(ops.take(tokens, index, axis=1), index, cache, source_mask)
        log_probs = _log_softmax_without_padding(logits)
        token = ops.where(done, PAD_ID, ops.cast(ops.argmax(log_probs, axis=-1), "int32"))
        log_prob += ops.where(done, 0.0, ops.max(log_probs, axis=-1))
        tokens = _write_column(tokens, index + 1, token)
        length = ops.where(done, length, index + 1)
        done = done | (token == eos_id) | (index + 1 >= length_limit)
        return index + 1, tokens, log_prob, length, done, cache

    tokens = ops.concatenate([ops.full((batch, 1), bos_id, "int32"), ops.zeros((batch, steps), "int32")], axis=1)
    state = (
        ops.convert_to_tensor(0, "int32"),
        tokens,
        ops.zeros((batch,), "float32"),
        ops.zeros((batch,), "int32"),
        ops.zeros((batch,), "bool"),
        model.init_cache(encoder_output, steps),
    )
    _, tokens, log_prob, length, _, _ = ops.while_loop(
        lambda index, *rest: (index < steps) & ~ops.all(rest[3]), step, state, maximum_iterations=steps
    )
    return SearchResult(_strip(tokens[:, 1:], eos_id), log_prob / length_penalty(length, alpha))


def beam_search(
    model,
    source_ids,
    *,
    beam_size=4,
    alpha=0.6,
    max_extra_length=50,
    max_length=None,
    return_all=False,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Translates `source_ids` `[batch, source_len]` with beam search and a length penalty.

    Each step extends the `beam_size` alive hypotheses of a sentence by every token and keeps
    the `beam_size` most likely extensions. Those that end (with the end-of-sentence id, or at
    the sentence's length limit) move to a separate set of finished hypotheses, ranked by
    `log P / lp`, and stop being alive. A sentence is done when no alive hypothesis can still
    beat its worst kept finished one: log-probabilities only fall as a hypothesis grows, so its
    best possible score is its log-probability over lp(length limit). With `beam_size=1` this is
    exactly greedy search.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, padded with 0.
        beam_size: k, the hypotheses kept per sentence.
        alpha: the length penalty exponent.
        max_extra_length: each output has at most its source's length + this many tokens.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        return_all: return all `beam_size` finished hypotheses per sentence, best first.
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult`: tokens `[batch, max_length]` and scores `[batch]`, or with
        `return_all` tokens `[batch, beam_size, max_length]` and scores `[batch, beam_size]`.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    k = beam_size
    batch = ops.shape(source_ids)[0]
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    best_possible_penalty = length_penalty(length_limit, alpha)[:, None]  # [batch, 1]
    # Row b * k + i of a flattened [batch * k, ...] tensor is hypothesis i of sentence b.
    first_row = ops.expand_dims(ops.arange(batch, dtype="int32") * k, 1)  # [batch, 1]

    # Each sentence's k hypotheses share its encoder output: repeat it to [batch * k, ...].
    encoder_output, source_mask = model.encode(source_ids, training=False)
    encoder_output = ops.repeat(encoder_output, k, axis=0)
    source_mask = ops.repeat(source_mask, k, axis=0)
    cache = model.init_cache(encoder_output, steps)

    def step(index, alive, alive_log_prob, finished, finished_score, done, cache):
        logits, cache = model.decode_step(ops.reshape(ops.take(alive, index, axis=2), (-1,)), index, cache, source_mask)
        vocab = ops.shape(logits)[-1]
        log_probs = ops.reshape(_log_softmax_without_padding(logits), (batch, k, vocab))
        candidates = ops.reshape(alive_log_prob[:, :, None] + log_probs, (batch, k * vocab))
        top_log_prob, top_index = ops.top_k(candidates, k)  # [batch, k]
        parent, token = top_index // vocab, top_index % vocab
        parent_rows = ops.reshape(parent + first_row, (-1,))

        sequences = _write_column(_take_rows(alive, parent_rows, k), index + 1, token)
        length = index + 1
        ending = (token == eos_id) | (length >= length_limit)[:, None]
        real = top_log_prob > NEG_INF / 2
        new_score = ops.where(ending & real, top_log_prob / length_penalty(length, alpha), NEG_INF)
        finished, finished_score = _top_k_of(
            ops.concatenate([finished, sequences], axis=1), ops.concatenate([finished_score, new_score], axis=1), k
        )

        alive_log_prob = ops.where(ending, NEG_INF, top_log_prob)
        best_alive = ops.max(alive_log_prob, axis=1, keepdims=True)
        cannot_improve = best_alive / best_possible_penalty <= finished_score[:, -1:]
        done = done | ops.squeeze(cannot_improve | (best_alive <= NEG_INF / 2), axis=1)
        alive_log_prob = ops.where(done[:, None], NEG_INF, alive_log_prob)  # a done sentence stays as it is
        return index + 1, sequences, alive_log_prob, finished, finished_score, done, model.reorder_cache(cache, parent_rows)

    start = ops.concatenate([ops.full((batch, k, 1), bos_id, "int32"), ops.zeros((batch, k, steps), "int32")], axis=2)
    # Only the first beam is live at the start, so the first step picks k different tokens.
    first_alive = ops.where(ops.arange(k) == 0, 0.0, NEG_INF) + ops.zeros((batch, 1), "float32")
    state = (
        ops.convert_to_tensor(0, "int32"),
        start,
        first_alive,
        ops.zeros_like(start),
        ops.full((batch, k), NEG_INF, "float32"),
        ops.zeros((batch,), "bool"),
        cache,
    )
    _, _, _, finished, finished_score, _, _ = ops.while_loop(
        lambda index, *rest: (index < steps) & ~ops.all(rest[4]), step, state, maximum_iterations=steps
    )
    tokens = _strip(finished[:, :, 1:], eos_id)
    if return_all:
        return SearchResult(tokens, finished_score)
    return SearchResult(tokens[:, 0], finished_score[:, 0])


def _length_limits(model, source_ids, max_extra_length, max_length):
    """Per sentence: real source length + max_extra_length, capped; and the loop's step count
    (a Python int where the source length is static, as under JAX)."""
    caps = [max_length] if max_length is not None else []
    if model.config.positional_encoding == "learned":
        caps.append(model.config.max_length)
    source_lengths = ops.sum(ops.cast(source_ids != PAD_ID, "int32"), axis=1)
    limit = source_lengths + max_extra_length
    steps = ops.shape(source_ids)[1] + max_extra_length
    for cap in caps:
        limit = ops.minimum(limit, cap)
        steps = min(steps, cap) if isinstance(steps, int) else ops.minimum(steps, cap)
    return ops.maximum(limit, 1), steps


def _log_softmax_without_padding(logits):
    log_probs = ops.log_softmax(logits, axis=-1)
    return ops.where(ops.arange(ops.shape(logits)[-1]) == PAD_ID, NEG_INF, log_probs)


def _write_column(sequences, column, values):
    """`sequences[..., column] = values`, without changing any shape."""
    return ops.where(ops.arange(ops.shape(sequences)[-1]) == column, values[..., None], sequences)


def _take_rows(sequences, rows, m):
    """`[batch, n, length]` sequences -> `[batch, m, length]`: the flat rows `rows`
    (`[batch * m]`, row b * n + i is sequence i of sentence b)."""
    batch, _, length = ops.shape(sequences)
    flat = ops.reshape(sequences, (-1, length))
    return ops.reshape(ops.take(flat, rows, axis=0), (batch, m, length))


def _top_k_of(sequences, scores, k):
    """The k best of `[batch, n, length]` sequences by `[batch, n]` scores, best first."""
    batch, n = ops.shape(scores)
    scores, index = ops.top_k(scores, k)
    rows = ops.reshape(index + ops.expand_dims(ops.arange(batch, dtype="int32") * n, 1), (-1,))
    return _take_rows(sequences, rows, k), scores


def _strip(tokens, eos_id):
    """Replaces the end-of-sentence id and everything after it by padding."""
    ended = ops.cumsum(ops.cast(tokens == eos_id, "int32"), axis=-1) > 0
    return ops.where(ended, PAD_ID, tokens)
