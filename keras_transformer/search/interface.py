"""What a search needs of a model: `DecodingModel`. `keras_transformer.Transformer` is one; a
test double that wraps one and changes its logits is another (tests/test_search.py)."""

from typing import Any, Protocol


class DecodingModel(Protocol):
    """A model that searches can decode from, one position a step.

    A cache is the model's own: a search gets one from `init_cache`, passes it to `decode_step`
    and `reorder_cache`, and carries it through its loop (any nest of tensors), never reading it.
    """

    config: Any  # the search reads `vocab_size`, `positional_encoding` and `max_length`

    def encode(self, source_ids, training=None):
        """int32 `[batch, source_len]`, padded with 0 -> (encoder output, source mask)."""

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        """A cache for decoding `hypotheses` outputs per sentence: growing, or preallocated
        for `max_length` positions; `shared_slots` as `Execution.shared_slots`."""

    def decode_step(self, token_ids, index, cache):
        """int32 `[batch * hypotheses]` tokens at position `index` (a sentence's hypotheses in
        adjacent rows) -> (float32 logits `[batch * hypotheses, vocab]` for position `index + 1`,
        the cache)."""

    def reorder_cache(self, cache, parents, sentences=None):
        """The cache after beam search keeps, as hypothesis i of each sentence, an extension of
        hypothesis `parents[b, i]` (int `[sentences, hypotheses]`); with `sentences` (int,
        ascending), only those sentences of the cache stay."""
