"""The processors a search runs each step (keras_transformer/search/processors/), chosen from
its settings; then the target prefix's, whose tokens are taken whatever the options say."""

from keras import ops

from keras_transformer.search import top_k
from keras_transformer.search.processors import log_softmax, one_value, per_row, prefix
from keras_transformer.search.settings import OPTIONS


class Processing:
    """The processors a search runs each step, chosen once from its settings: those of the options
    whose value turns them on for some sentence (a Python value other than the option's default,
    or per-sentence values), then the target prefix's (if any).

    Args:
        settings: a `DecodingSettings`.
        target_prefix: int32 `[batch, prefix_len]`, padded with 0, or None.
    """

    def __init__(self, settings, target_prefix=None):
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


def _typed(value, option):
    """Per-sentence values as a tensor of the option's kind's dtype; a Python value as is."""
    if one_value(value):
        return value
    return ops.convert_to_tensor(value, option.kind.dtype)
