"""Greedy and beam search over a trained `Transformer`, batched, with the decoder's key/value
cache; and sampling.

`decode(model, source_ids, settings)` is the one entry point for translations: evaluation,
export, benchmarks and the notebook call it with a `DecodingSettings`, whose defaults are the
paper's; `sample_search` draws outputs at random. The encoder runs once; the decoder advances
one position per step from its cache, which the model creates, writes and reorders
(keras_transformer/cache.py): a search never looks inside it (`DecodingModel`).
Written in `keras.ops`, so it runs under TensorFlow and under JAX; how it runs on a device (the
cache's layout, dropping finished sentences, the top-k kernel) is an `Execution`.

One idea per module: `settings` (what is asked), `execution` (how it runs), `interface` (what a
model provides), `greedy` and `beam` (the two searches), `sampling` (outputs drawn at random),
`loop` (the while loop), `top_k` (the best tokens of a step), `outputs` (length limits, writing
and cutting sequences), `prefix` (forcing the output's first tokens), `alignment` (the attention
an output paid to its source).
"""

from keras_transformer.search.alignment import alignments
from keras_transformer.search.beam import BeamState, beam_search
from keras_transformer.search.execution import Execution
from keras_transformer.search.greedy import GreedyState, greedy_search
from keras_transformer.search.interface import DecodingModel
from keras_transformer.search.sampling import SamplingSettings, sample_search
from keras_transformer.search.settings import STOPPING_RULES, DecodingSettings, SearchResult, length_penalty


def decode(model, source_ids, settings=DecodingSettings(), execution=None, *, max_length=None, target_prefix=None):
    """Translates `source_ids` with `settings`: greedy search for beam size 1, else beam search.

    Args:
        model: a `DecodingModel` (a `Transformer`).
        source_ids: int32 `[batch, source_len]`, each source ending with the end-of-sentence
            id, padded with 0.
        settings: a `DecodingSettings`.
        execution: an `Execution` (default: `Execution.choose()`: for the backend's default
            device, compiled under JAX only); pass `Execution.choose(compiled=True)` under
            `tf.function(jit_compile=True)`.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        target_prefix: int32 `[batch, prefix_len]`, padded with 0: tokens each output must
            start with (keras_transformer/search/prefix.py); None: none.

    Returns:
        A `SearchResult` with tokens `[batch, max_length]` and scores `[batch]`, or with
        `settings.num_hypotheses` n, `[batch, n, max_length]` and `[batch, n]`.
    """
    common = dict(alpha=settings.alpha, max_extra_length=settings.max_extra_length, max_length=max_length,
                  execution=execution, target_prefix=target_prefix)  # fmt: skip
    if settings.beam_size > 1:
        return beam_search(model, source_ids, beam_size=settings.beam_size, stopping=settings.stopping,
                           num_hypotheses=settings.num_hypotheses, **common)  # fmt: skip
    result = greedy_search(model, source_ids, **common)
    if settings.num_hypotheses is None:
        return result
    return SearchResult(result.tokens[:, None], result.scores[:, None])  # its one output as a 1-best list


__all__ = [
    "BeamState",
    "DecodingModel",
    "DecodingSettings",
    "Execution",
    "GreedyState",
    "STOPPING_RULES",
    "SamplingSettings",
    "SearchResult",
    "alignments",
    "beam_search",
    "decode",
    "greedy_search",
    "length_penalty",
    "sample_search",
]
