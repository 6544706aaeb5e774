"""Greedy search: the most likely token at each step; and the search it is an instance of, which
keeps one output per sentence and extends it by a token a rule picks (sampling is another)."""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.search.active import next_active, to_batch
from keras_transformer.search.execution import Execution
from keras_transformer.search.input_length import cut
from keras_transformer.search.loop import while_loop
from keras_transformer.search.outputs import length_limits, per_sentence, start_tokens, strip, write_column
from keras_transformer.search.processing import Processing
from keras_transformer.search.processors import Step
from keras_transformer.search.settings import SearchResult, length_penalty, settings_with

GreedyState = collections.namedtuple("GreedyState", ["index", "tokens", "log_prob", "length", "done", "active", "cache"])
GreedyState.__doc__ = """The loop state of `greedy_search`.

index: int32 scalar, the position being decoded.
tokens: int32 `[batch, steps + 1]`: BOS, the tokens up to `index`, then 0.
log_prob: float32 `[batch]`, log P of the tokens, up to and including the end of sentence.
length: int32 `[batch]`, the output's length so far (the end of sentence included).
done: bool `[batch]`: the output ended (end of sentence or length limit); stays True.
active: int32 `[a]`, ascending: the sentences the model decodes, those not done when
    `Execution.drop_finished`, else all of them.
cache: the model's, for the active sentences; unread here.
"""


def greedy_search(model, source_ids, settings=None, *, max_length=None, execution=None, target_prefix=None,
                  bos_id=BOS_ID, eos_id=EOS_ID, **options):  # fmt: skip
    """Translates `source_ids` `[batch, source_len]` by taking the most likely token each step
    (after the processors the options turn on, keras_transformer/search/processors/).

    The arguments are `beam_search`'s but `width` (the settings' beam size unread). Returns a
    `SearchResult` with tokens `[batch, max_length]` and scores `[batch]`.
    """
    execution = execution or Execution.choose()

    def most_likely(logits, processing, step):
        return processing.best_tokens(logits, 1, execution.top_k, step)

    return one_output_search(model, source_ids, most_likely, settings_with(settings, options), max_length=max_length,
                             execution=execution, target_prefix=target_prefix, bos_id=bos_id, eos_id=eos_id)  # fmt: skip


def one_output_search(model, source_ids, next_token, settings, *, max_length, execution, target_prefix, bos_id, eos_id):
    """A search that extends one output per sentence by the token `next_token` picks each step:
    greedy search, sampling (keras_transformer/search/sampling.py). Arguments as `greedy_search`'s,
    and `next_token(logits, processing, step)`: the active sentences' logits `[a, vocab]` for the
    position after `index`, the search's `Processing` and its `Step` (without processors, only
    its `index` and `sentence`) -> log-probabilities and tokens, `[a, 1]` each.
    """
    source_ids, _ = cut(ops.convert_to_tensor(source_ids, "int32"), settings.max_input_length)
    batch = ops.shape(source_ids)[0]
    static = execution.cache == "static"
    length_limit, steps = length_limits(model, source_ids, settings, max_length, static)  # [batch], scalar
    encoder_output, source_mask = model.encode(source_ids, training=False)
    processing = Processing(settings, target_prefix)

    def step(state):
        index, done = state.index, state.done
        token_ids = ops.take(ops.take(state.tokens, index, axis=1), state.active, axis=0)  # [a]
        logits, cache = model.decode_step(token_ids, index, state.cache)  # [a, vocab]
        seen = Step(index, None, state.active, None)
        if processing:
            seen = seen._replace(tokens=ops.take(state.tokens, state.active, axis=0))
        best_log_prob, best_token = next_token(logits, processing, seen)  # [a, 1] each
        best_log_prob = ops.reshape(to_batch(best_log_prob, state.active, batch, 1, execution), (-1,))  # [batch]
        best_token = ops.reshape(to_batch(best_token, state.active, batch, 1, execution), (-1,))  # [batch]
        token = ops.where(done, PAD_ID, best_token)  # [batch]
        done = done | (token == eos_id) | (index + 1 >= length_limit)  # [batch]
        only = ops.zeros((batch, 1), "int32")  # one output a sentence: its own parent
        active, cache = next_active(model, execution, cache, only, done, state.active)  # [a'], for a' sentences
        return GreedyState(
            index=index + 1,
            tokens=write_column(state.tokens, index + 1, token),
            log_prob=state.log_prob + ops.where(state.done, 0.0, best_log_prob),
            length=ops.where(state.done, state.length, index + 1),
            done=done,
            active=active,
            cache=cache,
        )

    state = GreedyState(
        index=ops.convert_to_tensor(0, "int32"),
        tokens=start_tokens((batch,), steps, bos_id),
        log_prob=ops.zeros((batch,), "float32"),
        length=ops.zeros((batch,), "int32"),
        done=ops.zeros((batch,), "bool"),
        active=ops.arange(batch, dtype="int32"),
        cache=model.init_cache(encoder_output, source_mask, 1, steps if static else None),
    )
    state = while_loop(lambda state: (state.index < steps) & ~ops.all(state.done), step, state, steps)
    alpha = per_sentence(settings.alpha, batch, "float32")
    return SearchResult(strip(state.tokens[:, 1:], eos_id), state.log_prob / length_penalty(state.length, alpha))
