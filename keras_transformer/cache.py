"""The decoder's key/value cache, for decoding one position a step (section 3.2.3's masked
self-attention, seen from inference): what each layer computed at earlier positions, and the
encoder output projected once for the encoder-decoder attention.

Two layouts, one class each, which differ in how a step writes and what a query may see:

- `GrowingCache`: each step appends its position, so attention reads only the positions decoded
  so far. Its shapes change from step to step, which a TensorFlow graph without XLA allows (the
  exported SavedModel runs so).
- `StaticCache`: preallocated for the longest output and written in place; every shape stays the
  same from step to step, as XLA and TPUs need, and a query sees the positions written so far.

Either holds a sentence's hypotheses (beam search) in one of two ways:

- own rows (`origin` None): each hypothesis has its rows, and beam search's reordering copies
  every layer's keys and values of the hypotheses it keeps.
- shared slots (`origin` a table): a sentence's hypotheses keep their keys and values in slots of
  one row, and `origin[b, i, s]` says which slot holds position s of hypothesis i's past.
  Reordering moves only that table; each hypothesis attends over its sentence's slots through a
  mask made from it, which costs `hypotheses` times the attention scores but no copy (in the
  manner of FasterTransformer's cache indirection).

A search never looks inside: it gets a cache from `Transformer.init_cache`, passes it to
`Transformer.decode_step` and `Transformer.reorder_cache`, and carries it through its loop.
Every tensor of a cache has the sentences (or their hypotheses' rows) on its first axis.
"""

import collections

from keras import ops

from keras_transformer.common import take_per_row

LayerCache = collections.namedtuple("LayerCache", ["self_key", "self_value", "cross_key", "cross_value"])
LayerCache.__doc__ = """One decoder layer's cache.

self_key, self_value: `[rows, num_heads, positions, key_dim]`. With own rows, a row per
    hypothesis and a position per step. With shared slots, a row per sentence, and position s of
    slot i at `s * hypotheses + i`: what the sentence's hypothesis i computed at step s.
cross_key, cross_value: `[rows, num_heads, source_len, key_dim]`, the encoder output projected
    once (with shared slots, once per sentence for all of its hypotheses).
"""


class DecoderCache(collections.namedtuple("DecoderCache", ["layers", "source_mask", "origin"])):
    """The cache of every decoder layer; a layout subclass (`GrowingCache`, `StaticCache`) says
    how a step writes and which written positions a query sees.

    layers: one `LayerCache` per decoder layer.
    source_mask: boolean `[rows, 1, source_len]`, True at real source tokens.
    origin: int32 `[sentences, hypotheses, steps]` with shared slots (module docstring), else None.
    """

    __slots__ = ()

    @classmethod
    def create(cls, cross, source_mask, self_shape, hypotheses=1, max_length=None, shared_slots=True):
        """An empty cache.

        Args:
            cross: per layer, the encoder output's `(key, value)` `[sentences, heads, source_len,
                key_dim]`.
            source_mask: boolean `[sentences, 1, source_len]`.
            self_shape: `(num_heads, key_dim)` of the self-attention keys and values.
            hypotheses: outputs decoded per sentence.
            max_length: the positions a `StaticCache` holds; None for a `GrowingCache`.
            shared_slots: a sentence's hypotheses in slots of one row (else rows of their own).
        """
        shared = shared_slots and hypotheses > 1  # one hypothesis has its row either way
        repeat = 1 if shared else hypotheses
        if repeat > 1:
            cross = [tuple(ops.repeat(t, repeat, axis=0) for t in pair) for pair in cross]
            source_mask = ops.repeat(source_mask, repeat, axis=0)
        key = cross[0][0]
        num_heads, key_dim = self_shape
        positions = (max_length or 0) * (hypotheses if shared else 1)
        empty = ops.zeros((ops.shape(key)[0], num_heads, positions, key_dim), key.dtype)
        origin = ops.zeros((ops.shape(source_mask)[0], hypotheses, max_length or 0), "int32") if shared else None
        return cls([LayerCache(empty, empty, *pair) for pair in cross], source_mask, origin)

    @property
    def queries_per_row(self):
        """The queries that attend together over a row: a sentence's hypotheses with shared
        slots, else 1."""
        return 1 if self.origin is None else self.origin.shape[1]

    # What a layout says.

    def write(self, stored, new, start, axis):
        """`stored` with `new` written along `axis` from position `start`."""
        raise NotImplementedError

    def written(self, length, index):
        """Boolean `[length]`: the positions of a cache axis of `length` that hold steps up to
        `index`; None when all of them do."""
        raise NotImplementedError

    # What a decoder step calls.

    def advance(self, index):
        """Before step `index`: (the cache with this step's positions in `origin`, the boolean
        self-attention visibility `[rows, queries_per_row, positions]`, or None where a query
        sees every position of its row)."""
        if self.origin is None:
            written = self.written(ops.shape(self.layers[0].self_key)[2], index)
            return self, None if written is None else written[None, None]
        hypotheses = self.origin.shape[1]
        slots = ops.arange(hypotheses, dtype="int32")[:, None]  # [i, 1]: each hypothesis writes its slot
        new = ops.broadcast_to(slots, (ops.shape(self.origin)[0], hypotheses, 1))
        origin = self.write(self.origin, new, index, axis=2)
        steps = ops.shape(origin)[2]
        visible = ops.expand_dims(origin, 3) == slots[:, 0]  # [sentence, i, step s, slot j]
        written = self.written(steps, index)
        if written is not None:
            visible = visible & written[:, None]
        return self._replace(origin=origin), ops.reshape(visible, (-1, hypotheses, steps * hypotheses))

    def append(self, layer, key, value, index):
        """`layer` (a `LayerCache`) with step `index`'s self-attention `key` and `value`
        `[rows, num_heads, queries_per_row, key_dim]` written."""
        start = index * key.shape[2]
        return layer._replace(self_key=self.write(layer.self_key, key, start, axis=2),
                              self_value=self.write(layer.self_value, value, start, axis=2))  # fmt: skip

    def reorder(self, parents, sentences=None):
        """The cache after beam search keeps, as hypothesis i of each sentence, an extension of
        its hypothesis `parents[b, i]` (int `[sentences, hypotheses]`). With `sentences` (int,
        ascending indices into the cache's sentences), only those stay, and `parents` has a row
        for each; a step where all stay copies nothing for them."""
        hypotheses = parents.shape[1]
        if sentences is not None:
            rows = sentences if self.origin is not None else _rows_of(sentences, hypotheses)
            cache_rows = ops.shape(self.source_mask)[0]
            kept = ops.cond(  # the sentences' keys and values are copied only when one leaves
                ops.shape(rows)[0] < cache_rows,
                lambda: tuple(ops.take(t, rows, axis=0) for t in self._per_row()),
                lambda: tuple(self._per_row()),
            )
            self = self._from_per_row(kept)
        if self.origin is not None:
            return self._replace(origin=take_per_row(self.origin, parents))
        if hypotheses == 1:  # one output a sentence continues itself
            return self
        rows = _rows_of(ops.arange(ops.shape(parents)[0], dtype="int32"), hypotheses, parents)
        layers = [layer._replace(self_key=ops.take(layer.self_key, rows, axis=0),
                                 self_value=ops.take(layer.self_value, rows, axis=0)) for layer in self.layers]  # fmt: skip
        return self._replace(layers=layers)

    def _per_row(self):
        tensors = [t for layer in self.layers for t in layer] + [self.source_mask]
        return tensors + ([] if self.origin is None else [self.origin])

    def _from_per_row(self, tensors):
        tensors = list(tensors)
        width = len(LayerCache._fields)
        layers = [LayerCache(*tensors[i * width : (i + 1) * width]) for i in range(len(self.layers))]
        rest = tensors[len(layers) * width :]
        return self._replace(layers=layers, source_mask=rest[0], origin=rest[1] if self.origin is not None else None)


def _rows_of(sentences, hypotheses, which=None):
    """The flat rows `[sentences * hypotheses]` of the sentences' hypotheses `which` (int
    `[sentences, hypotheses]`; default all, in order)."""
    which = ops.arange(hypotheses, dtype="int32")[None] if which is None else ops.cast(which, "int32")
    return ops.reshape(ops.expand_dims(sentences * hypotheses, 1) + which, (-1,))


class GrowingCache(DecoderCache):
    """Each step appends its positions (a copy of the cache, O(length), the cheapest write a
    graph without XLA has): every stored position has been written."""

    __slots__ = ()

    def write(self, stored, new, start, axis):
        return ops.concatenate([stored, ops.cast(new, stored.dtype)], axis=axis)

    def written(self, length, index):
        return None


class StaticCache(DecoderCache):
    """Preallocated: each step writes its positions in place, and a query sees those written."""

    __slots__ = ()

    def write(self, stored, new, start, axis):
        begin = [0] * len(stored.shape)
        begin[axis] = start
        return ops.slice_update(stored, begin, ops.cast(new, stored.dtype))

    def written(self, length, index):
        return ops.arange(length) <= index
