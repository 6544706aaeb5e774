"""What a search is asked for: the table of decoding options (`OPTIONS`), `DecodingSettings` (the
paper's decoding by default) made from it, the `SearchResult` a search returns, and the length
penalty it scores with."""

import argparse
import collections
import dataclasses

import numpy as np
from keras import ops

from keras_transformer.search.processors import (disable_unk, min_length, no_repeat_ngram, one_value,
                                                 repetition_penalty, suppress_sequences)  # fmt: skip


STOPPING_RULES = ("exact", "first_k")  # DecodingSettings.stopping
INF = float("inf")  # a float option's check refuses it (and NaN, which fails every comparison)


class Kind:
    """The kind of an option's values, and their form in each place: the type of its
    `DecodingSettings` field (`python`), the dtype of its per-sentence tensor in a search
    (`dtype`), the SavedModel input's dtype and rank (`served_dtype`, `served_rank`; `tokenized`:
    text that the export's tokenizer cuts into the search's ids), its flag, its warm-up value, the
    SavedModel input's default, and a served value's form in the search."""

    def __init__(self, python, dtype, served_dtype=None, served_rank=1, tokenized=False):
        self.python, self.dtype, self.served_dtype = python, dtype, served_dtype or dtype
        self.served_rank, self.tokenized = served_rank, tokenized

    def turns_on(self, values, default):
        """Elementwise: per-sentence `values` (a search's tensor) that may differ from `default`."""
        return values != default

    def add_flag(self, group, flag, default, help):
        group.add_argument(flag, type=self.python, default=default, help=help)

    def from_flag(self, value, tokenizer):
        """A flag's value as the `DecodingSettings` field's."""
        return value

    def needs_tokenizer(self, value):
        """Whether a flag's `value` needs the run's tokenizer (`from_flag`'s)."""
        return False

    def served(self, value):
        """A value (`example`) as the SavedModel input's for one sentence, in NumPy."""
        return np.dtype(self.served_dtype).type(value)

    def served_default(self, value, detokenize):
        """A `DecodingSettings` field's `value` as the SavedModel input's default, one row for
        every sentence, in NumPy; `detokenize` turns ids (a list of lists) into NumPy text."""
        return np.array([value], self.served_dtype)

    def from_served(self, values, tokenize):
        """A SavedModel input's `values` (a row per sentence) as the search's; `tokenize` turns
        text `[batch, s]` into ids `[batch, s, pieces]`."""
        return values


class _Bool(Kind):
    def add_flag(self, group, flag, default, help):
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)


class _Phrases(Kind):
    """Token sequences: in a search, `[batch, s, length]` ids padded with 0; served, each
    sentence's phrases as text (`[batch, s]` strings, "" for none); on the command line, a
    phrase a flag."""

    def turns_on(self, values, default):
        return values != 0

    def add_flag(self, group, flag, default, help):
        group.add_argument(flag, action="append", default=None, metavar="TEXT",
                           help=f"{help}: a phrase, cut into pieces (repeat the flag for more)")  # fmt: skip

    def from_flag(self, phrases, tokenizer):
        if not phrases:
            return ()
        if tokenizer is None:
            raise ValueError("token sequences need the run's tokenizer to cut the phrases into pieces.")
        return tuple(tuple(tokenizer.tokenize(phrase).numpy().tolist()) for phrase in phrases)

    def needs_tokenizer(self, phrases):
        return bool(phrases)

    def served(self, value):
        return np.array(value, object)

    def served_default(self, value, detokenize):
        if not value:
            return np.zeros([1, 0], object)
        return detokenize([list(sequence) for sequence in value])[None]

    def from_served(self, values, tokenize):
        return tokenize(values)


INT32, FLOAT32, BOOL = Kind(int, "int32"), Kind(float, "float32"), _Bool(bool, "bool")
PHRASES = _Phrases(tuple, "int32", served_dtype="string", served_rank=2, tokenized=True)


@dataclasses.dataclass(frozen=True)
class Option:
    """A decoding option: one row of `OPTIONS`, which gives `DecodingSettings` its field, the
    SavedModel's `options` signature its input (export/signatures.py), the commands that decode
    their flags (flags.py), and export/README.md its row.

    Args:
        name: the field's, input's and (with dashes) flag's name.
        kind: a `Kind`: INT32, FLOAT32, BOOL or PHRASES (token sequences).
        default: the paper's decoding; for an option with a processor, the value that turns it off.
        valid: which values are allowed, in words, for errors and documents.
        check: values -> bool, elementwise, for NumPy arrays and tensors alike; None: any value of
            the kind.
        help: what it does, for flags and documents.
        example: a value that turns it on, as a user would set it (CTranslate2's and fairseq's
            documented examples; for PHRASES, text): the warm-up requests and `bench.compare_exports --options` use it.
        processor: `process(log_probs, step, value)` (keras_transformer/search/processors/), for an
            option that acts in the step's seam; None for one that the searches read themselves.
        export_bound: an export's own value is the most a request may ask (the search's width).
    """

    name: str
    kind: Kind
    default: object
    valid: str
    check: object
    help: str
    example: object
    processor: object = None
    export_bound: bool = False

    def is_set(self, value):
        """Whether `value` (a Python value, or one per sentence) may differ from the default."""
        return not one_value(value) or value != self.default

    def sets_any(self, values):
        """Whether any of per-sentence `values` (a tensor) turns the option on: a scalar bool."""
        return ops.any(self.kind.turns_on(values, self.default))

    def check_value(self, value):
        """Raises ValueError naming the option unless each of `value`'s numbers is valid;
        symbolic tensors pass (the SavedModel checks them in its graph)."""
        if self.check is None or _symbolic(value):
            return
        values = np.asarray(value)
        if not np.all(self.check(values)):
            raise ValueError(f"Decoding option {self.name} must be {self.valid}; got {value!r}.")


OPTIONS = (
    Option("beam_size", INT32, 4, "at least 1, and at most the search width (the beam size of an export)",
           lambda v: v >= 1, "hypotheses kept per sentence; 1 is greedy search", 2, export_bound=True),
    Option("alpha", FLOAT32, 0.6, ">= 0 and finite", lambda v: (v >= 0) & (v < INF),
           "the length penalty's exponent: a score is log P / ((5 + length) / 6) ** alpha", 1.0),
    Option("max_length_a", FLOAT32, 1.0, ">= 0 and finite", lambda v: (v >= 0) & (v < INF),
           "an output has at most a * (source length) + b tokens (fairseq's --max-len-a)", 1.2),
    Option("max_length_b", INT32, 50, ">= 0", lambda v: v >= 0, "b of max_length_a (fairseq's --max-len-b)", 10),
    Option("min_length", INT32, 0, ">= 0", lambda v: v >= 0,
           "no end of sentence before this many output tokens", 3, min_length.process),
    Option("no_repeat_ngram_size", INT32, 0, ">= 0", lambda v: v >= 0,
           "no n-gram of this size twice in an output; 0: off", 3, no_repeat_ngram.process),
    Option("repetition_penalty", FLOAT32, 1.0, "> 0 and finite", lambda v: (v > 0) & (v < INF),
           "a token output already has its log-probability multiplied by this; 1: off", 1.2,
           repetition_penalty.process),
    Option("disable_unk", BOOL, False, "true or false", None, "never output the unknown token", True,
           disable_unk.process),
    Option("suppress_sequences", PHRASES, (), "token sequences", None,
           "token sequences an output must not contain", ("the", "a"), suppress_sequences.process),
    Option("max_input_length", INT32, 0, ">= 0", lambda v: v >= 0,
           "a longer source (in tokens, the end of sentence included) is cut to this many; 0: the model's limit", 20),
)  # fmt: skip
OPTION = {option.name: option for option in OPTIONS}


def _check(settings):
    for option in OPTIONS:
        option.check_value(getattr(settings, option.name))
    if isinstance(settings.beam_size, int) and settings.num_hypotheses is not None and not (
        1 <= settings.num_hypotheses <= settings.beam_size
    ):
        raise ValueError(f"Decoding returns 1 to beam_size ({settings.beam_size}) hypotheses a sentence; got "
                         f"num_hypotheses {settings.num_hypotheses}.")  # fmt: skip
    if settings.stopping not in STOPPING_RULES:
        raise ValueError(f"Decoding's stopping is one of {', '.join(STOPPING_RULES)}; got {settings.stopping!r}.")


def _symbolic(value):
    return hasattr(value, "shape") and not isinstance(value, np.ndarray) and not hasattr(value, "numpy")


DecodingSettings = dataclasses.make_dataclass(
    "DecodingSettings",
    [(option.name, option.kind.python, dataclasses.field(default=option.default)) for option in OPTIONS]
    + [("stopping", str, "exact"), ("num_hypotheses", int | None, None), ("alignment_layer", int, -1)],
    frozen=True,
    namespace={"__post_init__": _check, "__module__": __name__},
)
DecodingSettings.__doc__ = """How to decode: the paper's beam search by default (`hyperparameters.md`): beam 4, length
penalty `lp(Y) = ((5 + |Y|) / 6) ** alpha` with alpha 0.6, at most `source length + 50` output
tokens, early termination when possible. |Y| counts the output tokens including the
end-of-sentence token.

Its first fields are `OPTIONS`', one each, with the option's default: each a Python value for
every sentence, or one value per sentence (`[batch]`; `suppress_sequences`: `[batch, s,
length]` ids), as the SavedModel's `options` signature passes them. The others:

    stopping: when beam search is done with a sentence (`STOPPING_RULES`). "exact": once no
        alive hypothesis can beat the best ended one, whatever its continuation (the bound of
        tensor2tensor, the paper's code). "first_k": once `beam_size` hypotheses have ended (or
        sooner, where "exact" holds), returning the best of them, as CTranslate2, fairseq and
        Hugging Face's `early_stopping=True` do: fewer steps, and it may miss a longer hypothesis
        that would have scored higher (bench/README.md measures both).
    num_hypotheses: n, to get each sentence's n best outputs, best first (an n-best list: tokens
        `[batch, n, length]`, scores `[batch, n]`; 1 <= n <= beam_size); None for the best alone
        (`[batch, length]`, `[batch]`).
    alignment_layer: the decoder layer whose encoder-decoder attention `alignments` returns (a
        Python index: -1, the default, is the last).
"""


def search_width(settings):
    """The hypotheses a search keeps per sentence for `settings`: its beam size, or the largest of
    per-sentence beam sizes given as NumPy values (symbolic ones need the caller's width)."""
    if isinstance(settings.beam_size, int):
        return settings.beam_size
    if not hasattr(settings.beam_size, "numpy") and not isinstance(settings.beam_size, np.ndarray):
        raise ValueError("Per-sentence beam sizes as symbolic tensors need the search's width (an int).")
    return int(np.max(np.asarray(settings.beam_size)))


def settings_with(settings, options):
    """`settings` (default: `DecodingSettings()`) with `options` (field names -> values) replaced."""
    settings = settings if settings is not None else DecodingSettings()
    return dataclasses.replace(settings, **options) if options else settings


SearchResult = collections.namedtuple("SearchResult", ["tokens", "scores"])
SearchResult.__doc__ = """Output of `decode`, `greedy_search` and `beam_search`.

tokens: int32 `[batch, max_length]` (or `[batch, n, max_length]` for an n-best list), the output tokens
    without begin- and end-of-sentence ids, padded with 0.
scores: float32 `[batch]` (or `[batch, n]`), log P(Y | X) / lp(Y).
"""


def length_penalty(length, alpha):
    """`((5 + length) / 6) ** alpha` (GNMT; the paper's decoding, alpha = 0.6)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)
