"""Beam search with a length penalty (the paper's decoding, `hyperparameters.md`)."""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, EOS_ID, NEG_INF, take_per_row
from keras_transformer.search.active import next_active, to_batch
from keras_transformer.search.execution import Execution
from keras_transformer.search.input_length import cut
from keras_transformer.search.loop import while_loop
from keras_transformer.search.outputs import length_limits, per_sentence, start_tokens, strip, write_column
from keras_transformer.search.processing import Processing
from keras_transformer.search.processors import Step
from keras_transformer.search.settings import SearchResult, length_penalty, search_width, settings_with

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


def beam_search(model, source_ids, settings=None, *, width=None, max_length=None, execution=None, target_prefix=None,
                bos_id=BOS_ID, eos_id=EOS_ID, **options):  # fmt: skip
    """Translates `source_ids` `[batch, source_len]` with beam search and a length penalty.

    Each step extends the alive hypotheses of a sentence (at most its `beam_size`) by every
    token, the step's log-probabilities through the processors its options turn on
    (keras_transformer/search/processors/), and keeps the `beam_size` best extensions. Those that
    end (with the end-of-sentence id, or at the sentence's length limit) move to a separate set of
    finished hypotheses, ranked by `log P / lp`, and stop being alive. A sentence is done when no
    alive hypothesis can still beat the last finished one it returns (the n-th of an n-best
    list): log-probabilities only fall as a hypothesis grows, so its best possible score is its
    log-probability over lp(length limit). With `stopping="first_k"` it is also done once
    `beam_size` hypotheses have ended. With a beam size of 1 this is exactly greedy search.

    Args:
        model: a `DecodingModel` (a `Transformer`).
        source_ids: int32 `[batch, source_len]`, padded with 0.
        settings: a `DecodingSettings` (default: the paper's), whose fields `options` replace
            (`beam_search(model, ids, beam_size=2, no_repeat_ngram_size=3)`).
        width: k, the hypotheses the search keeps for each sentence, a Python int (default: the
            beam size, or the largest of per-sentence beam sizes given as NumPy values); a
            sentence's `beam_size` may be smaller.
        max_length: a hard cap on the output length (default: none, or the learned position
            table's size).
        execution: an `Execution` (default: `Execution.choose()`: for the backend's default
            device, compiled under JAX only).
        target_prefix: int32 `[batch, prefix_len]`, padded with 0: tokens each output must
            start with (keras_transformer/search/processors/prefix.py); a prefix longer than its
            sentence's length limit is cut there. None: no prefix.
        bos_id, eos_id: the begin- and end-of-sentence ids.

    Returns:
        A `SearchResult`: tokens `[batch, max_length]` and scores `[batch]`, or with
        `settings.num_hypotheses` n, tokens `[batch, n, max_length]` and scores `[batch, n]`.
    """
    settings = settings_with(settings, options)
    execution = execution or Execution.choose()
    k = width or search_width(settings)
    static = execution.cache == "static"
    source_ids, _ = cut(ops.convert_to_tensor(source_ids, "int32"), settings.max_input_length)
    batch = ops.shape(source_ids)[0]
    length_limit, steps = length_limits(model, source_ids, settings, max_length, static)  # [batch], scalar
    alpha = per_sentence(settings.alpha, batch, "float32")  # [batch]
    beam_size = per_sentence(settings.beam_size, batch, "int32")  # [batch]
    narrower = not isinstance(settings.beam_size, int) or settings.beam_size != k  # some sentence keeps fewer than k
    best_possible_penalty = length_penalty(length_limit, alpha)  # [batch]
    encoder_output, source_mask = model.encode(source_ids, training=False)
    processing = Processing(settings, target_prefix)
    per_row = min(k, model.config.vocab_size)  # a sentence's k best extensions are among these of each hypothesis
    returned = settings.num_hypotheses or 1  # finished hypotheses a sentence returns

    def step(state):
        index = state.index
        # The model extends the active sentences' hypotheses; a done sentence's rows get zeros.
        token_ids = ops.reshape(ops.take(ops.take(state.alive, index, axis=2), state.active, axis=0), (-1,))  # [a * k]
        logits, cache = model.decode_step(token_ids, index, state.cache)  # [a * k, vocab]
        sentence = ops.repeat(state.active, k)  # [a * k]
        seen = Step(index, None, sentence, None)
        if processing:
            tokens = ops.reshape(ops.take(state.alive, state.active, axis=0), (-1, ops.shape(state.alive)[2]))  # [a * k, steps + 1]
            seen = seen._replace(tokens=tokens)
        best_log_prob, best_token = processing.best_tokens(logits, per_row, execution.top_k, seen)  # [a * k, per_row] each
        best_log_prob = to_batch(best_log_prob, state.active, batch, k, execution)  # [batch, k, per_row]
        best_token = to_batch(best_token, state.active, batch, k, execution)  # [batch, k, per_row]

        # The best extensions of each sentence: its beam size of them, of the k the search keeps.
        candidates = state.alive_log_prob[:, :, None] + best_log_prob  # [batch, k, per_row]
        top_log_prob, top = ops.top_k(ops.reshape(candidates, (batch, k * per_row)), k)  # [batch, k] each
        if narrower:
            top_log_prob = ops.where(ops.arange(k) < beam_size[:, None], top_log_prob, NEG_INF)
        parent = top // per_row  # [batch, k]
        token = take_per_row(ops.reshape(best_token, (batch, k * per_row)), top)  # [batch, k]
        sequences = write_column(take_per_row(state.alive, parent), index + 1, token)  # [batch, k, steps + 1]

        # Those that end join the finished hypotheses; the others stay alive.
        ending = (token == eos_id) | (index + 1 >= length_limit)[:, None]  # [batch, k]
        real = top_log_prob > NEG_INF / 2  # [batch, k]: not an extension of a dead hypothesis
        score = ops.where(ending & real, top_log_prob / length_penalty(index + 1, alpha)[:, None], NEG_INF)  # [batch, k]
        finished, finished_score = _best(  # [batch, k, steps + 1], [batch, k]
            ops.concatenate([state.finished, sequences], axis=1), ops.concatenate([state.finished_score, score], axis=1), k
        )
        alive_log_prob = ops.where(ending, NEG_INF, top_log_prob)  # [batch, k]

        # A sentence is done once its best alive hypothesis cannot beat the returned one.
        best_alive = ops.max(alive_log_prob, axis=1)  # [batch]
        cannot_improve = best_alive / best_possible_penalty <= finished_score[:, returned - 1]  # [batch]
        done = state.done | cannot_improve | (best_alive <= NEG_INF / 2)  # [batch]
        if settings.stopping == "first_k":  # its beam size of hypotheses have ended
            last = take_per_row(finished_score, beam_size[:, None] - 1)[:, 0] if narrower else finished_score[:, k - 1]
            done = done | (last > NEG_INF / 2)  # [batch]

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
    if settings.num_hypotheses is None:
        return SearchResult(tokens[:, 0], state.finished_score[:, 0])
    return SearchResult(tokens[:, :returned], state.finished_score[:, :returned])


def _best(sequences, scores, k):
    """The k best of `[batch, n, length]` sequences by `[batch, n]` scores, best first."""
    scores, index = ops.top_k(scores, k)
    return take_per_row(sequences, index), scores
