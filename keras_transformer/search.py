"""Greedy and beam search over a trained `Transformer`, batched, with the decoder's key/value cache.

The encoder runs once; the decoder advances one position per step from its cache (see
`DecoderLayer`). Every loop variable keeps its shape from step to step, so both searches run
under a plain `tf.function` and compile with XLA (`jit_compile=True`), on CPU, GPU and TPU.

Decoding settings follow the paper (`hyperparameters.md`): beam 4, length penalty
`lp(Y) = ((5 + |Y|) / 6) ** alpha` with alpha 0.6, at most `source length + 50` output tokens,
early termination. |Y| counts the output tokens including the end-of-sentence token. The padding
id is never generated.
"""

import collections

import tensorflow as tf

from keras_transformer.model import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9

SearchResult = collections.namedtuple("SearchResult", ["tokens", "scores"])
SearchResult.__doc__ = """Output of `greedy_search` and `beam_search`.

tokens: int32 `[batch, max_length]` (or `[batch, n, max_length]` for n-best), the output tokens
    without begin- and end-of-sentence ids, padded with 0.
scores: float32 `[batch]` (or `[batch, n]`), log P(Y | X) / lp(Y).
"""


def length_penalty(length, alpha):
    """`((5 + length) / 6) ** alpha` (GNMT; the paper's decoding, alpha = 0.6)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


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
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    encoder_output, source_mask = model.encode(source_ids, training=False)
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    batch = tf.shape(source_ids)[0]

    def step(index, tokens, log_prob, length, done, cache):
        logits, cache = model.decode_step(tokens[:, index], index, cache, source_mask)
        log_probs = _log_softmax_without_padding(logits)
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        token = tf.where(done, PAD_ID, token)
        log_prob += tf.where(done, 0.0, tf.gather(log_probs, token, batch_dims=1))
        tokens = _write_column(tokens, index + 1, token)
        length = tf.where(done, length, index + 1)
        done |= (token == eos_id) | (index + 1 >= length_limit)
        return index + 1, tokens, log_prob, length, done, cache

    tokens = tf.concat([tf.fill([batch, 1], bos_id), tf.zeros([batch, steps], tf.int32)], axis=1)
    state = (
        tf.constant(0),
        tokens,
        tf.zeros([batch]),
        tf.zeros([batch], tf.int32),
        tf.zeros([batch], tf.bool),
        model.init_cache(encoder_output, steps),
    )
    _, tokens, log_prob, length, _, _ = tf.while_loop(
        lambda index, *rest: (index < steps) & ~tf.reduce_all(rest[3]), step, state, maximum_iterations=steps
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
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    k = beam_size
    batch = tf.shape(source_ids)[0]
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    best_possible_penalty = length_penalty(length_limit, alpha)[:, None]  # [batch, 1]

    # Each sentence's k hypotheses share its encoder output: tile it to [batch * k, ...].
    encoder_output, source_mask = model.encode(source_ids, training=False)
    encoder_output = tf.repeat(encoder_output, k, axis=0)
    source_mask = tf.repeat(source_mask, k, axis=0)
    cache = model.init_cache(encoder_output, steps)

    def step(index, alive, alive_log_prob, finished, finished_score, done, cache):
        logits, cache = model.decode_step(tf.reshape(alive[:, :, index], [-1]), index, cache, source_mask)
        vocab = tf.shape(logits)[-1]
        log_probs = tf.reshape(_log_softmax_without_padding(logits), [batch, k, vocab])
        candidates = tf.reshape(alive_log_prob[:, :, None] + log_probs, [batch, k * vocab])
        top_log_prob, top_index = tf.math.top_k(candidates, k)  # [batch, k]
        parent, token = top_index // vocab, top_index % vocab

        sequences = tf.gather(alive, parent, batch_dims=1)
        sequences = _write_column(sequences, index + 1, token)
        length = index + 1
        ending = (token == eos_id) | (length >= length_limit)[:, None]
        real = top_log_prob > NEG_INF / 2
        new_score = tf.where(ending & real, top_log_prob / length_penalty(length, alpha), NEG_INF)
        finished, finished_score = _top_k_of(
            tf.concat([finished, sequences], axis=1), tf.concat([finished_score, new_score], axis=1), k
        )

        alive_log_prob = tf.where(ending, NEG_INF, top_log_prob)
        best_alive = tf.reduce_max(alive_log_prob, axis=1, keepdims=True)
        cannot_improve = best_alive / best_possible_penalty <= finished_score[:, -1:]
        done |= tf.squeeze(cannot_improve | (best_alive <= NEG_INF / 2), axis=1)
        alive_log_prob = tf.where(done[:, None], NEG_INF, alive_log_prob)  # a done sentence stays as it is

        flat_parent = tf.reshape(parent + k * tf.range(batch)[:, None], [-1])
        cache = [
            {**layer, "self_key": tf.gather(layer["self_key"], flat_parent),
             "self_value": tf.gather(layer["self_value"], flat_parent)}
            for layer in cache
        ]  # fmt: skip
        return index + 1, sequences, alive_log_prob, finished, finished_score, done, cache

    start = tf.concat([tf.fill([batch, k, 1], bos_id), tf.zeros([batch, k, steps], tf.int32)], axis=2)
    # Only the first beam is live at the start, so the first step picks k different tokens.
    first_alive = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1])
    state = (
        tf.constant(0),
        start,
        first_alive,
        tf.zeros_like(start),
        tf.fill([batch, k], NEG_INF),
        tf.zeros([batch], tf.bool),
        cache,
    )
    _, _, _, finished, finished_score, _, _ = tf.while_loop(
        lambda index, *rest: (index < steps) & ~tf.reduce_all(rest[4]), step, state, maximum_iterations=steps
    )
    tokens = _strip(finished[:, :, 1:], eos_id)
    if return_all:
        return SearchResult(tokens, finished_score)
    return SearchResult(tokens[:, 0], finished_score[:, 0])


def _length_limits(model, source_ids, max_extra_length, max_length):
    """Per sentence: real source length + max_extra_length, capped; and the loop's step count."""
    caps = [max_length] if max_length is not None else []
    if model.config.positional_encoding == "learned":
        caps.append(model.config.max_length)
    source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    limit = source_lengths + max_extra_length
    steps = source_ids.shape[1]
    steps = (tf.shape(source_ids)[1] if steps is None else steps) + max_extra_length
    for cap in caps:
        limit = tf.minimum(limit, cap)
        steps = min(steps, cap) if isinstance(steps, int) else tf.minimum(steps, cap)
    return tf.maximum(limit, 1), steps


def _log_softmax_without_padding(logits):
    log_probs = tf.nn.log_softmax(logits)
    return log_probs + tf.one_hot(PAD_ID, tf.shape(logits)[-1], on_value=NEG_INF, off_value=0.0)


def _write_column(sequences, column, values):
    """`sequences[..., column] = values`, without changing any shape."""
    return tf.where(tf.range(tf.shape(sequences)[-1]) == column, values[..., None], sequences)


def _top_k_of(sequences, scores, k):
    """The k best of `[batch, n, length]` sequences by `[batch, n]` scores, best first."""
    scores, index = tf.math.top_k(scores, k)
    return tf.gather(sequences, index, batch_dims=1), scores


def _strip(tokens, eos_id):
    """Replaces the end-of-sentence id and everything after it by padding."""
    ended = tf.cumsum(tf.cast(tokens == eos_id, tf.int32), axis=-1) > 0
    return tf.where(ended, PAD_ID, tokens)
