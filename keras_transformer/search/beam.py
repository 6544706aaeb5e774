"""Beam search with a length penalty (the paper's decoding, `hyperparameters.md`)."""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, NEG_INF, take_per_row
from keras_transformer.search.active import next_active, to_batch
from keras_transformer.search.execution import Execution
from keras_transformer.search.loop import while_loop
from keras_transformer.search.outputs import length_limits, start_tokens, strip, write_column
from keras_transformer.search.prefix import force
from keras_transformer.search.settings import DecodingSettings, SearchResult, length_penalty
from keras_transformer.search.top_k import best_tokens

BeamState = collections.namedtuple(
    "BeamState", ["index", "alive", "alive_log_prob", "finished", "finished_score", "done", "active", "cache"]
)
BeamState.__doc__ = """The loop state of `beam_search`, for a batch of sentences with k hypotheses each.

index: int32 scalar, the position being decoded.
alive: int32 `[batch, k, steps + 1]`, the hypotheses still growing: BOS, tokens up to `index`, 0.
alive_log_prob: float32 `[batch, k]`, their log P; NEG_INF for one that ended, and for every
    hypothesis of a done sentence (so that nothing it is extended by can be chosen).
finished: int32 `[batch, k, steps + 1]`, the k best ended hypotheses (0 where there are none yet).
finished_score: float32 `[batch, k]`, their log P / lp, best first; NEG_INF where there are none.
done: bool `[batch]`: no alive hypothesis can beat the finished one the search returns; stays True.
active: int32 `[a]`, ascending: the sentences the model decodes, those not done when
    `Execution.drop_finished`, else all of them.
cache: the model's, for the active sentences' hypotheses; unread here.
"""


def beam_search(
    model,
    source_ids,
    *,
    beam_size=DecodingSettings.beam_size,
    alpha=DecodingSettings.alpha,
    max_extra_length=DecodingSettings.max_extra_length,
    stopping=DecodingSettings.stopping,
    max_length=None,
    execution=None,
    num_hypotheses=None,
    target_prefix=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
):
    """Translates `source_ids` `[batch, source_len]` with beam search and a length penalty.

    Each step extends the `beam_size` alive hypotheses of a sentence by every token and keeps
    the `beam_size` most likely extensions. Those that end (with the end-of-sentence id, or at
    the sentence's length limit) move to a separate set of finished hypotheses, ranked by
    `log P / lp`, and stop being alive. A sentence is done when no alive hypothesis can still
    beat the last finished one it returns (the n-th of an n-best list): log-probabilities only fall
    as a hypothesis grows, so its best possible score is its log-probability over lp(length
    limit). With `stopping="first_k"` it is also done once k hypotheses have ended. With
    `beam_size=1` this is exactly greedy search.

    Args:
        model: a `DecodingModel` (a `Transformer`).
        source_ids: int32 `[batch, source_len]`, padded with 0.
        beam_size: k, the hypotheses kept per sentence.
        alpha: the length penalty exponent.
        max_extra_length: each output has at most its source's length + this many tokens.
        stopping: "exact" or "first_k" (`DecodingSettings.stopping`).
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        execution: an `Execution` (default: `Execution.choose()`).
        num_hypotheses: n, to return the n best finished hypotheses of each sentence, best first
            (1 <= n <= beam_size); None for the best alone.
        target_prefix: int32 `[batch, prefix_len]`, padded with 0: tokens each output must
            start with (keras_transformer/search/prefix.py); a prefix longer than its
            sentence's length limit is cut there. None: no prefix.
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult`: tokens `[batch, max_length]` and scores `[batch]`, or with
        `num_hypotheses` tokens `[batch, n, max_length]` and scores `[batch, n]`.
    """
    DecodingSettings(beam_size, alpha, max_extra_length, stopping, num_hypotheses)  # checks them
    execution = execution or Execution.choose()
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    k = beam_size
    batch = ops.shape(source_ids)[0]
    length_limit, steps = length_limits(model, source_ids, max_extra_length, max_length)  # [batch], scalar
    best_possible_penalty = length_penalty(length_limit, alpha)  # [batch]
    encoder_output, source_mask = model.encode(source_ids, training=False)
    per_row = min(k, model.config.vocab_size)  # a sentence's k best extensions are among these of each hypothesis
    returned = num_hypotheses or 1  # finished hypotheses a sentence returns

    def step(state):
        index = state.index
        # The model extends the active sentences' hypotheses; a done sentence's rows get zeros.
        token_ids = ops.reshape(ops.take(ops.take(state.alive, index, axis=2), state.active, axis=0), (-1,))  # [a * k]
        logits, cache = model.decode_step(token_ids, index, state.cache)  # [a * k, vocab]
        best_log_prob, best_token = best_tokens(logits, per_row, execution.top_k)  # [a * k, per_row] each
        best_log_prob = to_batch(best_log_prob, state.active, batch, k, execution)  # [batch, k, per_row]
        best_token = to_batch(best_token, state.active, batch, k, execution)  # [batch, k, per_row]
        if target_prefix is not None:  # while forced, a sentence's one alive hypothesis takes the prefix's token
            best_log_prob, best_token = force(logits, best_log_prob, best_token, target_prefix, index, state.active, execution)

        # The k best extensions of each sentence.
        candidates = state.alive_log_prob[:, :, None] + best_log_prob  # [batch, k, per_row]
        top_log_prob, top = ops.top_k(ops.reshape(candidates, (batch, k * per_row)), k)  # [batch, k] each
        parent = top // per_row  # [batch, k]
        token = take_per_row(ops.reshape(best_token, (batch, k * per_row)), top)  # [batch, k]
        sequences = write_column(take_per_row(state.alive, parent), index + 1, token)  # [batch, k, steps + 1]

        # Those that end join the finished hypotheses; the others stay alive.
        ending = (token == eos_id) | (index + 1 >= length_limit)[:, None]  # [batch, k]
        real = top_log_prob > NEG_INF / 2  # [batch, k]: not an extension of a dead hypothesis
        score = ops.where(ending & real, top_log_prob / length_penalty(index + 1, alpha), NEG_INF)  # [batch, k]
        finished, finished_score = _best(  # [batch, k, steps + 1], [batch, k]
            ops.concatenate([state.finished, sequences], axis=1), ops.concatenate([state.finished_score, score], axis=1), k
        )
        alive_log_prob = ops.where(ending, NEG_INF, top_log_prob)  # [batch, k]

        # A sentence is done once its best alive hypothesis cannot beat the returned one.
        best_alive = ops.max(alive_log_prob, axis=1)  # [batch]
        cannot_improve = best_alive / best_possible_penalty <= finished_score[:, returned - 1]  # [batch]
        done = state.done | cannot_improve | (best_alive <= NEG_INF / 2)  # [batch]
        if stopping == "first_k":
            done = done | (finished_score[:, k - 1] > NEG_INF / 2)  # [batch]: k hypotheses have ended

        active, cache = next_active(model, execution, cache, parent, done, state.active)  # [a'], for a' sentences
        return BeamState(
            index=index + 1,
            alive=sequences,
            alive_log_prob=ops.where(done[:, None], NEG_INF, alive_log_prob),
            finished=finished,
            finished_score=finished_score,
            done=done,
            active=active,
            cache=cache,
        )

    start = start_tokens((batch, k), steps, bos_id)  # [batch, k, steps + 1]
    static = execution.cache == "static"
    state = BeamState(
        index=ops.convert_to_tensor(0, "int32"),
        alive=start,
        # Only the first hypothesis is alive at the start, so the first step picks k different tokens.
        alive_log_prob=ops.where(ops.arange(k) == 0, 0.0, NEG_INF) + ops.zeros((batch, 1), "float32"),
        finished=ops.zeros_like(start),
        finished_score=ops.full((batch, k), NEG_INF, "float32"),
        done=ops.zeros((batch,), "bool"),
        active=ops.arange(batch, dtype="int32"),
        cache=model.init_cache(encoder_output, source_mask, k, steps if static else None, execution.shared_slots),
    )
    state = while_loop(lambda state: (state.index < steps) & ~ops.all(state.done), step, state, steps)
    tokens = strip(state.finished[:, :, 1:], eos_id)
    if num_hypotheses is None:
        return SearchResult(tokens[:, 0], state.finished_score[:, 0])
    return SearchResult(tokens[:, :returned], state.finished_score[:, :returned])


def _best(sequences, scores, k):
    """The k best of `[batch, n, length]` sequences by `[batch, n]` scores, best first."""
    scores, index = ops.top_k(scores, k)
    return take_per_row(sequences, index), scores
