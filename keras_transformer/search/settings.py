"""What a search is asked for: `DecodingSettings` (the paper's decoding by default), the
`SearchResult` it returns, and the length penalty it scores with."""

import collections
import dataclasses

from keras import ops


STOPPING_RULES = ("exact", "first_k")  # DecodingSettings.stopping


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode: the paper's beam search by default (`hyperparameters.md`): beam 4, length
    penalty `lp(Y) = ((5 + |Y|) / 6) ** alpha` with alpha 0.6, at most `source length + 50`
    output tokens, early termination when possible. |Y| counts the output tokens including the
    end-of-sentence token.

    Args:
        beam_size: hypotheses kept per sentence; 1 is greedy search.
        alpha: the length penalty exponent.
        max_extra_length: each output has at most its source's length + this many tokens.
        stopping: when beam search is done with a sentence (`STOPPING_RULES`). "exact": once no
            alive hypothesis can beat the best ended one, whatever its continuation (the bound
            of tensor2tensor, the paper's code). "first_k": once `beam_size` hypotheses have
            ended (or sooner, where "exact" holds), returning the best of them, as CTranslate2,
            fairseq and Hugging Face's `early_stopping=True` do: fewer steps, and it may miss a
            longer hypothesis that would have scored higher (bench/README.md measures both).
        num_hypotheses: n, to get each sentence's n best outputs, best first (an n-best list:
            tokens `[batch, n, length]`, scores `[batch, n]`; 1 <= n <= beam_size); None for
            the best alone (`[batch, length]`, `[batch]`).
        alignment_layer: the decoder layer whose encoder-decoder attention `alignments` returns
            (a Python index: -1, the default, is the last).
    """

    beam_size: int = 4
    alpha: float = 0.6
    max_extra_length: int = 50
    stopping: str = "exact"
    num_hypotheses: int | None = None
    alignment_layer: int = -1

    def __post_init__(self):
        if self.beam_size < 1 or self.max_extra_length < 0 or self.alpha < 0:
            raise ValueError(
                f"Decoding needs beam_size >= 1, alpha >= 0 and max_extra_length >= 0; got beam_size "
                f"{self.beam_size}, alpha {self.alpha}, max_extra_length {self.max_extra_length}."
            )
        if self.num_hypotheses is not None and not 1 <= self.num_hypotheses <= self.beam_size:
            raise ValueError(f"Decoding returns 1 to beam_size ({self.beam_size}) hypotheses a sentence; got "
                             f"num_hypotheses {self.num_hypotheses}.")  # fmt: skip
        if self.stopping not in STOPPING_RULES:
            raise ValueError(f"Decoding's stopping is one of {', '.join(STOPPING_RULES)}; got {self.stopping!r}.")


SearchResult = collections.namedtuple("SearchResult", ["tokens", "scores"])
SearchResult.__doc__ = """Output of `decode`, `greedy_search` and `beam_search`.

tokens: int32 `[batch, max_length]` (or `[batch, n, max_length]` for an n-best list), the output tokens
    without begin- and end-of-sentence ids, padded with 0.
scores: float32 `[batch]` (or `[batch, n]`), log P(Y | X) / lp(Y).
"""


def length_penalty(length, alpha):
    """`((5 + length) / 6) ** alpha` (GNMT; the paper's decoding, alpha = 0.6)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)
