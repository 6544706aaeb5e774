"""The XLA-compiled search of `python -m export --xla`: for servers started with
`--xla_cpu_compilation_enabled=true` (TF Serving compiles XLA functions on CPUs only then; the
default export needs no XLA).

XLA compiles a search for fixed shapes: its cache preallocated, no op of a step left to run
alone, so one sentence decodes at about twice the graph's speed (bench/README.md). Requests come
in any shape, so an export compiles a few (`CompiledShapes`): a request of at most
`max(batch_sizes)` sentences whose longest source fits in `max(source_lengths)` pieces is padded
to the smallest compiled shape that holds it (rows of a lone end of sentence, columns of
padding) and runs compiled; any other request runs the default export's graph search, which
drops sentences as they finish, and so wins on large batches. No request is refused.

Each compiled shape is compiled once, when the server first runs it: the export's warm-up
requests (export/saved_model.py) hold one request of every compiled shape, so that no user's
request waits for a compilation.
"""

import dataclasses

import tensorflow as tf

from keras_transformer.common import EOS_ID, PAD_ID
from keras_transformer.search import Execution
from keras_transformer.search.loop import graph_function

# The execution of a search compiled by XLA on CPUs (a static cache, the argmax top k).
COMPILED_EXECUTION = Execution.choose(compiled=True, platform="cpu")


@dataclasses.dataclass(frozen=True)
class CompiledShapes:
    """The request shapes an XLA export compiles its search for: every pair of a batch size and
    a source length (in pieces, the end of sentence included), each sorted ascending.

    The defaults: one and two sentences, which the graph serves worst (a step's fixed cost), and
    source lengths in steps of 16 up to 64 pieces (about 50 words, most sentences of a page or a
    chat): 2 x 4 compilations. Measured on the multi30k model (bench/README.md), the compiled
    search against the graph: 2.4-2.5x at batch 1, 1.5x at 2, even at 4, 0.73-0.76x at 8 (a
    compiled batch decodes the sentences that are done until the last ends).
    """

    batch_sizes: tuple = (1, 2)
    source_lengths: tuple = (16, 32, 48, 64)

    def __post_init__(self):
        for name in ("batch_sizes", "source_lengths"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)) or values[0] < 1:
                raise ValueError(f"CompiledShapes.{name} must be positive numbers in ascending order; got {values}.")

    def within(self, max_source_length):
        """These shapes for a model whose sources are cut to `max_source_length` pieces: longer
        source lengths, which no request reaches, give way to that length."""
        lengths = [length for length in self.source_lengths if length < max_source_length]
        if len(lengths) < len(self.source_lengths):
            lengths.append(max_source_length)
        return dataclasses.replace(self, source_lengths=tuple(lengths))

    @property
    def shapes(self):
        """Every compiled `(batch, source length)`, in the order of `index`."""
        return [(batch, length) for batch in self.batch_sizes for length in self.source_lengths]

    def index(self, batch, length):
        """The position in `shapes` of the smallest shape that holds a request of `batch`
        sources of at most `length` pieces (scalar int32 tensors), or -1 if none does."""
        batch_index = tf.searchsorted(tf.constant(self.batch_sizes), batch[None], side="left")[0]
        length_index = tf.searchsorted(tf.constant(self.source_lengths), length[None], side="left")[0]
        fits = (batch_index < len(self.batch_sizes)) & (length_index < len(self.source_lengths))
        return tf.where(fits, batch_index * len(self.source_lengths) + length_index, -1)


class CompiledSearch:
    """`search(source_ids, COMPILED_EXECUTION)` (`decode` with the export's settings) compiled by
    XLA for each of `shapes`' shapes; the graph search `fallback(source_ids)` for requests that
    none holds.

    Args:
        search: source ids `[batch, length]` of static shape, an `Execution` -> `SearchResult`.
        shapes: the `CompiledShapes`.
        fallback: source ids `[batch, length]` -> `SearchResult`, the default export's search.
    """

    def __init__(self, search, shapes, fallback):
        self.shapes, self.fallback = shapes, fallback
        self.functions = [
            graph_function(lambda ids: search(ids, COMPILED_EXECUTION), jit_compile=True,
                           input_signature=[tf.TensorSpec(shape, tf.int32)]).get_concrete_function()
            for shape in shapes.shapes
        ]  # fmt: skip

    def __call__(self, source_ids):
        """int32 `[batch, length]` -> a `SearchResult`, tokens `[batch, steps]`."""
        batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        index = self.shapes.index(batch, length)
        branches = [lambda shape=shape, function=function: self._padded(function, shape, source_ids)
                    for shape, function in zip(self.shapes.shapes, self.functions)]  # fmt: skip
        return tf.cond(index >= 0, lambda: tf.switch_case(tf.maximum(index, 0), branches),
                       lambda: self.fallback(source_ids))  # fmt: skip

    @staticmethod
    def _padded(function, shape, source_ids):
        """`function`'s result for `source_ids` padded to `shape`, cut back to its rows."""
        batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        rows = tf.pad(source_ids, [[0, 0], [0, shape[1] - length]], constant_values=PAD_ID)
        filler = tf.one_hot(tf.zeros([shape[0] - batch], tf.int32), shape[1], on_value=EOS_ID, off_value=PAD_ID,
                            dtype=tf.int32)  # a lone end of sentence: a source that ends at once  # fmt: skip
        result = function(tf.ensure_shape(tf.concat([rows, filler], axis=0), shape))
        return type(result)(*(value[:batch] for value in result))
