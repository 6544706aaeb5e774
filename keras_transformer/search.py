"""Greedy and beam search over a trained `Transformer`, batched, with the decoder's key/value cache.

`decode(model, source_ids, settings)` is the one entry point: evaluation, export, benchmarks and
the notebook call it with a `DecodingSettings`, whose defaults are the paper's (`hyperparameters.md`):
beam 4, length penalty `lp(Y) = ((5 + |Y|) / 6) ** alpha` with alpha 0.6, at most
`source length + 50` output tokens, early termination. |Y| counts the output tokens including the
end-of-sentence token. The padding id is never generated (the model gives it `NEG_INF`).

The encoder runs once; the decoder advances one position per step from its cache, which the
model creates, writes and reorders (keras_transformer/decoder.py): the search never looks inside
it. Written in `keras.ops`, so it runs under TensorFlow and under JAX. Two cache layouts:

- growing (the default under TensorFlow): each step appends one position, and attention reads
  only the positions decoded so far. Its shapes change from step to step, which a TensorFlow
  graph without XLA allows (the exported SavedModel runs so).
- static (`static_shapes=True`; always under JAX): preallocated for the longest output, written
  in place, every loop variable keeping its shape, as XLA and TPUs need. Pass it when compiling
  with `tf.function(jit_compile=True)`.
"""

import collections
import dataclasses

import keras
from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, NEG_INF, PAD_ID, take_per_row


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode: the paper's beam search by default.

    Args:
        beam_size: hypotheses kept per sentence; 1 is greedy search.
        alpha: the length penalty exponent.
        max_extra_length: each output has at most its source's length + this many tokens.
    """

    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50

    def __post_init__(self):
        if self.beam_size < 1 or self.max_extra_length < 0 or self.alpha < 0:
            raise ValueError(
                f"Decoding needs beam_size >= 1, alpha >= 0 and max_extra_length >= 0; got beam_size "
                f"{self.beam_size}, alpha {self.alpha}, max_extra_length {self.max_extra_length}."
            )


SearchResult = collections.namedtuple("SearchResult", ["tokens", "scores"])
SearchResult.__doc__ = """Output of `decode`, `greedy_search` and `beam_search`.

tokens: int32 `[batch, max_length]` (or `[batch, n, max_length]` for n-best), the output tokens
    without begin- and end-of-sentence ids, padded with 0.
scores: float32 `[batch]` (or `[batch, n]`), log P(Y | X) / lp(Y).
"""

GreedyState = collections.namedtuple("GreedyState", ["index", "tokens", "log_prob", "length", "done", "cache"])
GreedyState.__doc__ = """The loop state of `greedy_search`.

index: the position being decoded (scalar). tokens: int32 `[batch, steps + 1]`, BOS then the
outputs. log_prob, length, done: `[batch]`. cache: the model's, unread here.
"""

BeamState = collections.namedtuple(
    "BeamState", ["index", "alive", "alive_log_prob", "finished", "finished_score", "done", "active", "cache"]
)
BeamState.__doc__ = """The loop state of `beam_search`, for a batch of sentences with k hypotheses each.

index: the position being decoded (scalar). alive: int32 `[batch, k, steps + 1]`, the hypotheses
still growing (BOS, then tokens); alive_log_prob: `[batch, k]`, their log P (NEG_INF once they
end). finished, finished_score: the k best ended hypotheses and their log P / lp. done:
`[batch]`, no alive hypothesis can beat the finished ones. active: int32, the sentences the
model still decodes, ascending (with the growing cache, those not done; else all). cache: the
model's, for the active sentences, unread here.
"""


def decode(model, source_ids, settings=DecodingSettings(), *, static_shapes=None, max_length=None, searches=1):
    """Translates `source_ids` with `settings`: greedy search for beam size 1, else beam search.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, each source ending with the end-of-sentence
            id, padded with 0.
        settings: a `DecodingSettings`.
        static_shapes: use the static cache (default: under JAX only); True for XLA.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        searches: split the batch between this many independent searches (`in_parallel`).

    Returns:
        A `SearchResult` with tokens `[batch, max_length]` and scores `[batch]`.
    """
    common = dict(alpha=settings.alpha, max_extra_length=settings.max_extra_length, max_length=max_length,
                  static_shapes=static_shapes)  # fmt: skip
    if settings.beam_size == 1:
        search = lambda ids: greedy_search(model, ids, **common)  # noqa: E731
    else:
        search = lambda ids: beam_search(model, ids, beam_size=settings.beam_size, **common)  # noqa: E731
    return in_parallel(search, source_ids, searches)


def in_parallel(search, source_ids, searches):
    """`search(source_ids)`, a `SearchResult`, as `searches` independent searches over consecutive
    slices of the batch (some may be empty), concatenated: the same result.

    For TensorFlow graphs on CPUs. The graph then holds that many loops that share nothing, and
    TensorFlow runs them side by side, one per core, when each op runs on one thread (intra-op
    parallelism 1, as `export.serving.use_serving_threads` sets): a decoding step is a chain
    of small ops, which gain less from being spread over the cores than they lose to the
    threads' hand-offs. With TensorFlow's default threads it makes little difference.
    """
    if searches == 1:
        return search(source_ids)
    if keras.config.backend() == "tensorflow" and source_ids.shape[0] is None:  # a served graph (XLA's know theirs)
        import tensorflow as tf

        # One function, called once per slice: the graph (and a SavedModel) holds the search once.
        search = tf.function(search, input_signature=[tf.TensorSpec([None, None], "int32")])
    batch = ops.shape(source_ids)[0]
    cuts = [batch * i // searches for i in range(searches + 1)]
    results = [search(source_ids[start:end]) for start, end in zip(cuts, cuts[1:])]
    return SearchResult(*(ops.concatenate(parts, axis=0) for parts in zip(*results)))


def length_penalty(length, alpha):
    """`((5 + length) / 6) ** alpha` (GNMT; the paper's decoding, alpha = 0.6)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def greedy_search(
    model,
    source_ids,
    *,
    alpha=DecodingSettings.alpha,
    max_extra_length=DecodingSettings.max_extra_length,
    max_length=None,
    static_shapes=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Translates `source_ids` `[batch, source_len]` by taking the most likely token each step.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, padded with 0.
        alpha: length penalty exponent, for the returned score only.
        max_extra_length: each output has at most its source's length + this many tokens.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        static_shapes: the static cache (module docstring); default: under JAX only.
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult` with tokens `[batch, max_length]` and scores `[batch]`.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    static_shapes = _static_shapes(static_shapes)
    encoder_output, source_mask = model.encode(source_ids, training=False)
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    batch = ops.shape(source_ids)[0]

    def step(state):
        index, done = state.index, state.done
        logits, cache = model.decode_step(ops.take(state.tokens, index, axis=1), index, state.cache, source_mask)
        best_log_prob, best_token = _best_tokens(logits, 1, static_shapes)
        token = ops.where(done, PAD_ID, best_token[:, 0])
        return GreedyState(
            index=index + 1,
            tokens=_write_column(state.tokens, index + 1, token),
            log_prob=state.log_prob + ops.where(done, 0.0, best_log_prob[:, 0]),
            length=ops.where(done, state.length, index + 1),
            done=done | (token == eos_id) | (index + 1 >= length_limit),
            cache=cache,
        )

    state = GreedyState(
        index=ops.convert_to_tensor(0, "int32"),
        tokens=ops.concatenate([ops.full((batch, 1), bos_id, "int32"), ops.zeros((batch, steps), "int32")], axis=1),
        log_prob=ops.zeros((batch,), "float32"),
        length=ops.zeros((batch,), "int32"),
        done=ops.zeros((batch,), "bool"),
        cache=model.init_cache(encoder_output, 1, steps if static_shapes else None),
    )
    state = _while_loop(lambda state: (state.index < steps) & ~ops.all(state.done), step, state, steps, static_shapes)
    return SearchResult(_strip(state.tokens[:, 1:], eos_id), state.log_prob / length_penalty(state.length, alpha))


def beam_search(
    model,
    source_ids,
    *,
    beam_size=DecodingSettings.beam_size,
    alpha=DecodingSettings.alpha,
    max_extra_length=DecodingSettings.max_extra_length,
    max_length=None,
    static_shapes=None,
    return_all=False,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Translates `source_ids` `[batch, source_len]` with beam search and a length penalty.

    Each step extends the `beam_size` alive hypotheses of a sentence by every token and keeps
    the `beam_size` most likely extensions. Those that end (with the end-of-sentence id, or at
    the sentence's length limit) move to a separate set of finished hypotheses, ranked by
    `log P / lp`, and stop being alive. A sentence is done when no alive hypothesis can still
    beat the finished one it returns (with `return_all`, the k-th): log-probabilities only fall
    as a hypothesis grows, so its best possible score is its log-probability over lp(length
    limit). With `beam_size=1` this is exactly greedy search.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, padded with 0.
        beam_size: k, the hypotheses kept per sentence.
        alpha: the length penalty exponent.
        max_extra_length: each output has at most its source's length + this many tokens.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        static_shapes: the static cache (module docstring); default: under JAX only.
        return_all: return all `beam_size` finished hypotheses per sentence, best first.
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult`: tokens `[batch, max_length]` and scores `[batch]`, or with
        `return_all` tokens `[batch, beam_size, max_length]` and scores `[batch, beam_size]`.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    static_shapes = _static_shapes(static_shapes)
    k = beam_size
    batch = ops.shape(source_ids)[0]
    length_limit, steps = _length_limits(model, source_ids, max_extra_length, max_length)
    best_possible_penalty = length_penalty(length_limit, alpha)[:, None]  # [batch, 1]
    encoder_output, source_mask = model.encode(source_ids, training=False)
    per_row = min(k, model.config.vocab_size)
    returned = k if return_all else 1  # finished hypotheses per sentence that must be final
    # Where shapes may change, the model stops decoding a sentence once it is done, as
    # CTranslate2 does: a batch costs what its unfinished sentences cost.
    drop_done = not static_shapes

    def rows_of(sentences):  # the flat rows of their hypotheses
        return ops.reshape(ops.expand_dims(sentences * k, 1) + ops.arange(k, dtype="int32"), (-1,))

    def step(state):
        index = state.index
        decoded = rows_of(state.active)
        token_ids = ops.take(ops.reshape(ops.take(state.alive, index, axis=2), (-1,)), decoded)
        active_mask = ops.take(source_mask, state.active, axis=0)
        logits, cache = model.decode_step(token_ids, index, state.cache, active_mask)
        # A sentence's k best extensions are among the k best tokens of each of its hypotheses.
        best_log_prob, best_token = _best_tokens(logits, per_row, static_shapes)  # [active * k, per_row]
        if drop_done:  # back in every row: a done sentence's NEG_INF log P outweighs these zeros
            best_log_prob = ops.scatter(decoded[:, None], best_log_prob, (batch * k, per_row))
            best_token = ops.scatter(decoded[:, None], best_token, (batch * k, per_row))
        candidates = state.alive_log_prob[:, :, None] + ops.reshape(best_log_prob, (batch, k, per_row))
        top_log_prob, top_index = ops.top_k(ops.reshape(candidates, (batch, k * per_row)), k)  # [batch, k]
        parent = top_index // per_row
        token = take_per_row(ops.reshape(best_token, (batch, k * per_row)), top_index)
        sequences = _write_column(take_per_row(state.alive, parent), index + 1, token)
        length = index + 1
        ending = (token == eos_id) | (length >= length_limit)[:, None]
        real = top_log_prob > NEG_INF / 2
        new_score = ops.where(ending & real, top_log_prob / length_penalty(length, alpha), NEG_INF)
        finished, finished_score = _top_k_of(
            ops.concatenate([state.finished, sequences], axis=1),
            ops.concatenate([state.finished_score, new_score], axis=1),
            k,
        )

        alive_log_prob = ops.where(ending, NEG_INF, top_log_prob)
        best_alive = ops.max(alive_log_prob, axis=1, keepdims=True)
        cannot_improve = best_alive / best_possible_penalty <= finished_score[:, returned - 1 : returned]
        done = state.done | ops.squeeze(cannot_improve | (best_alive <= NEG_INF / 2), axis=1)
        active = state.active
        if drop_done:
            active = ops.cast(ops.nonzero(~done)[0], "int32")
            parents = ops.take(parent, active, axis=0)
            # The cache holds the sentences decoded this step: number the kept ones among those.
            # Only a step where a sentence ends copies the cache (the sentences' gather).
            kept = ops.take(_positions(state.active, batch), active)
            cache = ops.cond(
                ops.shape(active)[0] < ops.shape(state.active)[0],
                lambda: model.reorder_cache(cache, parents, kept),
                lambda: model.reorder_cache(cache, parents),
            )
        else:
            cache = model.reorder_cache(cache, parent)
        return BeamState(
            index=index + 1,
            alive=sequences,
            alive_log_prob=ops.where(done[:, None], NEG_INF, alive_log_prob),  # a done sentence stays as it is
            finished=finished,
            finished_score=finished_score,
            done=done,
            active=active,
            cache=cache,
        )

    start = ops.concatenate([ops.full((batch, k, 1), bos_id, "int32"), ops.zeros((batch, k, steps), "int32")], axis=2)
    state = BeamState(
        index=ops.convert_to_tensor(0, "int32"),
        alive=start,
        # Only the first hypothesis is alive at the start, so the first step picks k different tokens.
        alive_log_prob=ops.where(ops.arange(k) == 0, 0.0, NEG_INF) + ops.zeros((batch, 1), "float32"),
        finished=ops.zeros_like(start),
        finished_score=ops.full((batch, k), NEG_INF, "float32"),
        done=ops.zeros((batch,), "bool"),
        active=ops.arange(batch, dtype="int32"),
        cache=model.init_cache(encoder_output, k, steps if static_shapes else None),
    )
    state = _while_loop(lambda state: (state.index < steps) & ~ops.all(state.done), step, state, steps, static_shapes)
    tokens = _strip(state.finished[:, :, 1:], eos_id)
    if return_all:
        return SearchResult(tokens, state.finished_score)
    return SearchResult(tokens[:, 0], state.finished_score[:, 0])


def _static_shapes(static_shapes):
    return keras.config.backend() != "tensorflow" if static_shapes is None else static_shapes


def _while_loop(condition, step, state, steps, static_shapes):
    """`state = step(state)` while `condition(state)`, for at most `steps` steps, over a named
    state. Without `static_shapes` its tensors may change shape, which TensorFlow allows when told
    so (shape invariants): along their first axis (sentences that a search stops decoding, or a
    batch whose size the graph does not know) and along any axis that starts empty (a growing
    cache)."""
    kind = type(state)
    loop = dict(maximum_iterations=steps)
    if not static_shapes and keras.config.backend() == "tensorflow":
        import tensorflow as tf

        def relax(tensor):
            return tf.TensorShape([None if axis == 0 or size == 0 else size for axis, size in enumerate(tensor.shape)])

        loop["shape_invariants"] = tuple(tf.nest.map_structure(relax, field) for field in state)
        while_loop = tf.while_loop
    else:
        while_loop = ops.while_loop

    def body(*fields):
        return tuple(step(kind(*fields)))

    return kind(*while_loop(lambda *fields: condition(kind(*fields)), body, tuple(state), **loop))


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


def _best_tokens(logits, n, static_shapes):
    """The `n` most likely tokens of each row of `logits` `[rows, vocab]` and their
    log-probabilities, both `[rows, n]`. Only the normaliser is computed over the whole
    vocabulary, not every log-probability."""
    best, tokens = _top_k(logits, n, _top_k_by_argmax if static_shapes else ops.top_k)
    # log_softmax's way, relative to the row's maximum, stays exact for near-certain tokens.
    shifted = best - best[:, :1]
    log_normaliser = ops.log(ops.sum(ops.exp(logits - best[:, :1]), axis=-1, keepdims=True))
    return shifted - log_normaliser, ops.cast(tokens, "int32")


def _top_k(values, k, top_k):
    """`top_k(values, k)` over `[rows, vocab]`, in two short passes over chunks of 32 to 128
    entries (the vocabulary padded to whole chunks): the k best values lie in the k chunks with
    the best maxima. On CPUs a top k of a long row costs several times one pass of maxima.
    `top_k` finds the top k of the short rows: `ops.top_k`, or `_top_k_by_argmax` for XLA."""
    vocab = values.shape[-1]
    if k == 1 or vocab < 4 * k * 32:
        return top_k(values, k)
    chunk = next((size for size in range(32, 129) if vocab % size == 0), 64)
    padding = -vocab % chunk
    if padding:
        values = ops.pad(values, ((0, 0), (0, padding)), constant_values=float("-inf"))
    chunks = ops.reshape(values, (-1, (vocab + padding) // chunk, chunk))
    _, best_chunks = top_k(ops.max(chunks, axis=-1), k)  # [rows, k]
    candidates = take_per_row(chunks, best_chunks)  # [rows, k, chunk]
    best, position = top_k(ops.reshape(candidates, (-1, k * chunk)), k)
    chunk_of = take_per_row(best_chunks, position // chunk)
    return best, chunk_of * chunk + position % chunk


def _top_k_by_argmax(values, k):
    """`ops.top_k(values, k)` over `[rows, n]` as k passes of argmax, each masking the value it
    found, for XLA: its CPU top k sorts each row, 50x slower at beam search's small k (the
    passes fuse); a sort past k = 16. Equal values come in index order, as from top_k."""
    if k > 16:
        return ops.top_k(values, k)
    n = values.shape[-1]
    positions = ops.arange(n, dtype="int32")
    best, indices = [], []
    for _ in range(k):
        best.append(ops.max(values, axis=-1, keepdims=True))
        if n > 1024:
            # Over a vocabulary, argmax as the first position holding the maximum: plain
            # reductions, which XLA's CPU backend vectorizes, where its argmax reduces (value,
            # index) pairs, 6% of a greedy step. Over short rows the argmax is faster.
            index = ops.min(ops.where(values == best[-1], positions, n - 1), axis=-1, keepdims=True)
        else:
            index = ops.cast(ops.argmax(values, axis=-1), "int32")[:, None]
        indices.append(index)
        if len(indices) < k:
            values = ops.where(positions == index, float("-inf"), values)
    return ops.concatenate(best, axis=1), ops.concatenate(indices, axis=1)


def _positions(indices, size):
    """`[size]`: at each of `indices` (distinct ints below `size`), its position among them."""
    return ops.scatter(indices[:, None], ops.arange(ops.shape(indices)[0], dtype="int32"), (size,))


def _write_column(sequences, column, values):
    """`sequences[..., column] = values`, without changing any shape."""
    return ops.where(ops.arange(ops.shape(sequences)[-1]) == column, values[..., None], sequences)


def _top_k_of(sequences, scores, k):
    """The k best of `[batch, n, length]` sequences by `[batch, n]` scores, best first."""
    scores, index = ops.top_k(scores, k)
    return take_per_row(sequences, index), scores


def _strip(tokens, eos_id):
    """Replaces the end-of-sentence id and everything after it by padding."""
    ended = ops.cumsum(ops.cast(tokens == eos_id, "int32"), axis=-1) > 0
    return ops.where(ended, PAD_ID, tokens)
