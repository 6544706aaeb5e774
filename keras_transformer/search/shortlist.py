"""A vocabulary shortlist: decoding that scores only the target tokens a request's sources can
need, not the whole vocabulary (Marian's lexical shortlist, CTranslate2's vocabulary map).

A lexical table gives each source token its likeliest target tokens; a request's candidates
are the union of its source tokens' rows, a list of tokens that are always candidates, the
special ids and any token the caller forces (a target prefix). The search then runs over
`ShortlistModel`, a `DecodingModel` whose logits are those candidates' alone: a step's output
projection, log-softmax and top-k cost K columns instead of the vocabulary's. The search itself
is unchanged: it works in the candidates' own ids (`to_candidates`), which keep the special ids
0-3 in place, and its outputs are mapped back (`to_vocabulary`).
"""

import dataclasses

from keras import ops

from keras_transformer.common import EOS_ID, PAD_ID
from keras_transformer.search.settings import OPTIONS

SPECIAL_IDS = EOS_ID + 1  # ids 0-3 (padding, unknown, begin and end of sentence): candidates of every request


def candidates(source_ids, table, always, forced=None, minimum=1, size=None):
    """The candidates of a request, sorted ascending: int32 `[K]`.

    Args:
        source_ids: int `[batch, source_len]`, padded with 0.
        table: int32 `[vocab, k]`, row s the candidates of source token s, padded with 0.
        always: int32 `[n]`, the tokens that are candidates of every request.
        forced: int, any shape, tokens that must be candidates (0 is ignored), or None.
        minimum: K is at least this: padded with 0 (padding's logit is `NEG_INF`: never chosen),
            so that a search may take that many best tokens a step (beam search: 2 * width).
        size: None: K is the candidates' count (or `minimum`); an int (XLA's static shapes): K
            is `size`, padded with 0, which must be at least the count (`most_candidates`).

    The ids 0-3 are always candidates, so they keep their place: candidate i is id i for i < 4.
    """
    vocab = ops.shape(table)[0]
    source_ids = ops.cast(source_ids, "int32")
    parts = [ops.arange(SPECIAL_IDS, dtype="int32"), ops.cast(always, "int32"),
             ops.reshape(ops.take(table, source_ids, axis=0), (-1,))]  # fmt: skip
    if forced is not None:
        parts.append(ops.reshape(ops.cast(forced, "int32"), (-1,)))
    ids = ops.concatenate(parts, axis=0)
    chosen = ops.scatter(ids[:, None], ops.ones_like(ids), (vocab,)) > 0  # [vocab]
    if size is not None:  # the candidates first, the lowest id first; then padding
        order = ops.where(chosen, vocab - ops.arange(vocab, dtype="int32"), 0)
        first, ids = ops.top_k(order, max(size, minimum))
        return ops.where(first > 0, ops.cast(ids, "int32"), 0)
    found = ops.cast(ops.nonzero(chosen)[0], "int32")
    return ops.concatenate([found, ops.zeros((ops.maximum(minimum - ops.shape(found)[0], 0),), "int32")], axis=0)


def most_candidates(source_shape, table_width, always, vocab_size):
    """The most candidates that sources of `source_shape` `(batch, source_len)` can have with a
    table of `table_width` columns and `always` tokens: a static K for `candidates`."""
    batch, length = source_shape
    return min(vocab_size, SPECIAL_IDS + always + batch * length * table_width)


def to_candidates(ids, vocabulary):
    """Vocabulary ids (any shape) -> their places in `vocabulary` (int32 `[K]`, from
    `candidates`); -1 for an id that is not a candidate. Padding stays 0."""
    ids = ops.cast(ids, "int32")
    matches = ops.expand_dims(ids, -1) == vocabulary
    return ops.where(ops.any(matches, axis=-1), ops.cast(ops.argmax(matches, axis=-1), "int32"), -1)


def to_vocabulary(tokens, vocabulary):
    """A search's tokens in the candidates' ids -> vocabulary ids (padding stays 0)."""
    return ops.take(vocabulary, ops.cast(tokens, "int32"), axis=0)


def restrict_settings(settings, vocabulary, batch):
    """`settings` (a `DecodingSettings`) with the token ids its options hold (those of a
    tokenized kind: `suppress_sequences`) in the candidates' ids, per sentence of `batch`: a
    sequence with a token that is not a candidate can never be output, and becomes padding
    (it bans nothing)."""
    changes = {}
    for option in OPTIONS:
        value = getattr(settings, option.name)
        if not option.kind.tokenized or not option.is_set(value):
            continue
        if isinstance(value, tuple):  # one tuple of sequences for every sentence
            span = max(len(sequence) for sequence in value)
            value = ops.convert_to_tensor([list(sequence) + [PAD_ID] * (span - len(sequence)) for sequence in value], "int32")
            value = ops.broadcast_to(value[None], (batch, *value.shape))
        mapped = to_candidates(value, vocabulary)
        changes[option.name] = ops.where(ops.any(mapped < 0, axis=-1, keepdims=True), PAD_ID, mapped)
    return dataclasses.replace(settings, **changes) if changes else settings


def search_over(vocabulary, search, model, source_ids, settings, target_prefix=None, **kwargs):
    """`search(model, source_ids, settings, target_prefix=..., **kwargs)` (`decode`,
    `beam_search`, ...) over `vocabulary`'s tokens alone (int32 `[K]`, from `candidates`, which
    must hold the prefix's tokens): its result, in vocabulary ids."""
    prefix = None if target_prefix is None else to_candidates(target_prefix, vocabulary)
    settings = restrict_settings(settings, vocabulary, ops.shape(source_ids)[0])
    result = search(ShortlistModel(model, vocabulary), source_ids, settings, target_prefix=prefix, **kwargs)
    return result._replace(tokens=to_vocabulary(result.tokens, vocabulary))


class ShortlistModel:
    """A `DecodingModel` over a `Transformer` whose logits are those of `vocabulary` alone.

    Args:
        model: the `Transformer`.
        vocabulary: int32 `[K]`, from `candidates`: token i of a search over this model is
            `vocabulary[i]` of `model`'s.

    `decode_step` returns float32 logits `[batch * hypotheses, K]`; the cache is the model's,
    with its output projection cut to K columns once, when the search creates it.
    """

    def __init__(self, model, vocabulary):
        self.model = model
        self.vocabulary = ops.cast(vocabulary, "int32")
        self.config = model.config

    def encode(self, source_ids, training=None):
        return self.model.encode(source_ids, training=training)

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        cache = self.model.init_cache(encoder_output, source_mask, hypotheses, max_length, shared_slots)
        return cache._replace(logits_kernel=ops.take(cache.logits_kernel, self.vocabulary, axis=1),
                              logits_bias=ops.take(cache.logits_bias, self.vocabulary, axis=0))  # fmt: skip

    def decode_step(self, token_ids, index, cache):
        return self.model.decode_step(to_vocabulary(token_ids, self.vocabulary), index, cache)

    def reorder_cache(self, cache, parents, sentences=None):
        return self.model.reorder_cache(cache, parents, sentences)
