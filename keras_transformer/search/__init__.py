"""Greedy and beam search over a trained `Transformer`, batched, with the decoder's key/value
cache; and sampling.

`decode(model, source_ids, settings)` is the one entry point for translations: evaluation,
export, benchmarks and the notebook call it with a `DecodingSettings`, whose defaults are the
paper's; `sample_search` draws outputs at random. The encoder runs once; the decoder advances
one position per step from its cache, which the model creates, writes and reorders
(keras_transformer/cache.py): a search never looks inside it (`DecodingModel`).
Written in `keras.ops`, so it runs under TensorFlow and under JAX; how it runs on a device (the
cache's layout, dropping finished sentences, the top-k kernel) is an `Execution`.

One idea per module: `settings` (what is asked: the table of decoding options), `execution` (how
it runs), `interface` (what a model provides), `greedy` and `beam` (the two searches), `sampling`
(outputs drawn at random), `processors` (the seam between the model's log-probabilities and a
search's choice, one module per option that acts there, and the target prefix), `scoring` (given
translations' log-probabilities), `loop` (the while loop), `top_k` (the best tokens of a step), `outputs` (length limits, writing and cutting
sequences), `input_length` (cutting long sources), `alignment` (the attention an output paid to
its source), `shortlist` (a search over a request's candidate tokens alone).
"""

from keras_transformer.search.alignment import alignments
from keras_transformer.search.beam import BeamState, beam_search
from keras_transformer.search.execution import Execution
from keras_transformer.search.greedy import GreedyState, greedy_search
from keras_transformer.search.interface import DecodingModel
from keras_transformer.search.sampling import SAMPLING_OPTIONS, SamplingSettings, sample_search
from keras_transformer.search.scoring import ScoreResult, score
from keras_transformer.search.settings import (OPTION, OPTIONS, STOPPING_RULES, DecodingSettings, Option, SearchResult,
                                               length_penalty, search_width, settings_with)  # fmt: skip


def decode(model, source_ids, settings=None, execution=None, *, width=None, max_length=None, target_prefix=None, **options):
    """Translates `source_ids` with `settings`: greedy search for a width of 1, else beam search.

    The arguments and the result are `beam_search`'s; each option of `settings` (default: the
    paper's decoding) is one value or one per sentence, and `options` replace its fields
    (`decode(model, ids, no_repeat_ngram_size=3)`). Under `tf.function(jit_compile=True)` pass
    `execution=Execution.choose(compiled=True)`.
    """
    settings = settings_with(settings, options)
    width = width or search_width(settings)
    common = dict(max_length=max_length, execution=execution, target_prefix=target_prefix)
    if width > 1:
        return beam_search(model, source_ids, settings, width=width, **common)
    result = greedy_search(model, source_ids, settings, **common)
    if settings.num_hypotheses is None:
        return result
    return SearchResult(result.tokens[:, None], result.scores[:, None])  # its one output as a 1-best list


__all__ = [
    "BeamState",
    "DecodingModel",
    "DecodingSettings",
    "Execution",
    "GreedyState",
    "OPTION",
    "OPTIONS",
    "Option",
    "SAMPLING_OPTIONS",
    "STOPPING_RULES",
    "SamplingSettings",
    "ScoreResult",
    "SearchResult",
    "alignments",
    "beam_search",
    "decode",
    "greedy_search",
    "length_penalty",
    "sample_search",
    "score",
]
