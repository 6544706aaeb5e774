"""The seam of a search step. The model's log-probabilities for the next token go through the
processors that the decoding options turn on, then to the search's selection: greedy, beam or
sampling (fairseq's `Search.step`, Hugging Face's logits processors).

A processor is a function `process(log_probs, step, value) -> log_probs`, one module each:
`log_probs` float32 `[rows, vocab]` as the processors before it left them, `step` a `Step`,
`value` its option's value for each row (or one Python value for every row). It bans a token
with `NEG_INF` or changes its value; it never renormalises, so a token it leaves alone keeps the
model's log-probability and a search's score stays the model's log P(Y | X) / lp(Y) wherever
only bans apply (keras_transformer/search/settings.py's `OPTIONS` says which option runs which
processor). keras_transformer/search/processing.py runs them.
"""

import collections

from keras import ops

from keras_transformer.common import NEG_INF

Step = collections.namedtuple("Step", ["index", "tokens", "sentence", "model_log_probs"])
Step.__doc__ = """What a processor sees at a step, for `rows` hypotheses (a sentence's in adjacent rows).

index: int32 scalar, the position decoded from: the step picks each row's token at `index + 1`.
tokens: int32 `[rows, steps + 1]`, each row's begin of sentence, its tokens at 1 to `index`, then 0.
sentence: int32 `[rows]`, the sentence of each row (an index into the batch's per-sentence values).
model_log_probs: float32 `[rows, vocab]`, the model's own, before any processor.
"""


def one_value(value):
    """Whether an option's value is one Python value for every sentence (not one per sentence)."""
    return isinstance(value, (bool, int, float, str, tuple))


def log_softmax(logits):
    """float32 `[rows, vocab]`, as keras_transformer/search/top_k.py's `best_tokens` computes it
    (relative to each row's maximum)."""
    logits = ops.cast(logits, "float32")
    return logits - ops.logsumexp(logits, axis=-1, keepdims=True)


def per_row(value, sentence):
    """A per-sentence value `[batch, ...]` taken for each row's `sentence`; a Python value as is."""
    if one_value(value):
        return value
    return ops.take(value, sentence, axis=0)


def column(value):
    """A row's value as `[rows, 1]` (a Python value as is), to broadcast over the vocabulary."""
    if isinstance(value, (bool, int, float)):
        return value
    return ops.reshape(value, (-1, 1))


def ban(log_probs, banned):
    """`log_probs` with `NEG_INF` where `banned` (bool, broadcast to `[rows, vocab]`)."""
    return ops.where(banned, NEG_INF, log_probs)


def token_mask(tokens, where, vocab):
    """bool `[rows, vocab]`: True at each row's `tokens` `[rows, n]` (int) where `where`
    (bool `[rows, n]`) holds."""
    rows, n = ops.shape(tokens)[0], ops.shape(tokens)[1]
    row = ops.repeat(ops.arange(rows, dtype="int32")[:, None], n, axis=1)
    indices = ops.stack([ops.reshape(row, (-1,)), ops.reshape(ops.cast(tokens, "int32"), (-1,))], axis=1)
    counts = ops.scatter(indices, ops.reshape(ops.cast(where, "int32"), (-1,)), (rows, vocab))
    return counts > 0


def generated(step, vocab):
    """bool `[rows, vocab]`: the tokens each row has output so far (positions 1 to `index`)."""
    position = ops.arange(ops.shape(step.tokens)[1])
    so_far = (position >= 1) & (position <= step.index)
    return token_mask(step.tokens, ops.broadcast_to(so_far[None], ops.shape(step.tokens)), vocab)
