"""The seam of a search step. The model's log-probabilities for the next token go through the
processors that the decoding options turn on, then to the search's selection: greedy, beam or
sampling (fairseq's `Search.step`, Hugging Face's logits processors).

A processor is a function `process(log_probs, step, value) -> log_probs`, one module each:
`log_probs` float32 `[rows, vocab]` as the processors before it left them, `step` a `Step`,
`value` its option's value for each row (or one Python value for every row). It bans a token
with `NEG_INF` or changes its value; it never renormalises, so a token it leaves alone keeps the
model's log-probability and a search's score stays the model's log P(Y | X) / lp(Y) wherever
only bans apply (keras_transformer/search/settings.py's `OPTIONS` says which option runs which
processor). The target prefix is the last: its tokens are taken whatever the options say.
"""

import collections

from keras import ops

from keras_transformer.common import NEG_INF
from keras_transformer.search import top_k
from keras_transformer.search.processors import prefix

Step = collections.namedtuple("Step", ["index", "tokens", "sentence", "source_length", "model_log_probs"])
Step.__doc__ = """What a processor sees at a step, for `rows` hypotheses (a sentence's in adjacent rows).

index: int32 scalar, the position decoded from: the step picks each row's token at `index + 1`.
tokens: int32 `[rows, steps + 1]`, each row's begin of sentence, its tokens at 1 to `index`, then 0.
sentence: int32 `[rows]`, the sentence of each row (an index into the batch's per-sentence values).
source_length: int32 `[rows]`, its source's length (the end of sentence included).
model_log_probs: float32 `[rows, vocab]`, the model's own, before any processor.
"""


class Processing:
    """The processors a search runs each step, chosen once from its settings: those of the options
    whose value turns them on for some sentence (a Python value other than the option's default,
    or per-sentence values), then the target prefix's (if any).

    Args:
        settings: a `DecodingSettings`.
        target_prefix: int32 `[batch, prefix_len]`, padded with 0, or None.
    """

    def __init__(self, settings, target_prefix=None):
        from keras_transformer.search.settings import OPTIONS

        self.processors = [(option, _typed(getattr(settings, option.name), option)) for option in OPTIONS
                           if option.processor is not None and option.is_set(getattr(settings, option.name))]  # fmt: skip
        self.target_prefix = None if target_prefix is None else ops.convert_to_tensor(target_prefix, "int32")

    def __bool__(self):
        return bool(self.processors) or self.target_prefix is not None

    def __call__(self, logits, step):
        """The log-probabilities `[rows, vocab]` the selection reads: log-softmax of `logits`
        `[rows, vocab]`, through each processor. `step`: a `Step` without `model_log_probs`."""
        step = step._replace(model_log_probs=log_softmax(logits))
        log_probs = step.model_log_probs
        for option, value in self.processors:
            value = per_row(value, step.sentence)
            if one_value(value):
                log_probs = option.processor(log_probs, step, value)
            else:  # per-sentence values (a served request's): skipped at a step where no row sets them
                log_probs = ops.cond(option.sets_any(value), lambda o=option, v=value, p=log_probs: o.processor(p, step, v),
                                     lambda p=log_probs: p)  # fmt: skip
        if self.target_prefix is not None:
            log_probs = prefix.process(log_probs, step, per_row(self.target_prefix, step.sentence))
        return log_probs

    def best_tokens(self, logits, n, kernel, step):
        """The `n` best tokens of each row of `logits` `[rows, vocab]` after the processors, and
        their log-probabilities, `[rows, n]` each, found by `kernel` (`Execution.top_k`);
        without processors, keras_transformer/search/top_k.py's `best_tokens` (`step` unread)."""
        if not self:
            return top_k.best_tokens(logits, n, kernel)
        values, tokens = top_k.top_k(self(logits, step), n, kernel)
        return values, ops.cast(tokens, "int32")


def one_value(value):
    """Whether an option's value is one Python value for every sentence (not one per sentence)."""
    return isinstance(value, (bool, int, float, str, tuple))


def _typed(value, option):
    """Per-sentence values as a tensor of the option's dtype (token ids for "string"); a Python
    value as is."""
    if one_value(value):
        return value
    return ops.convert_to_tensor(value, "int32" if option.dtype == "string" else option.dtype)


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
