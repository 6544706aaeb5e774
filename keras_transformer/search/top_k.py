"""Each hypothesis's best next tokens: a top k over the vocabulary, and the kernels that find it
(`Execution.top_k`); and the log-probability of a given token (`token_log_probs`). All give `ops.top_k`'s result, equal values in index order
(tests/test_search.py compares them with a full sort).

The thresholds below were chosen by the A/B measurements in bench/README.md's decoding section
(2 cores of this project's CPU machine).
"""

from keras import ops

from keras_transformer.common import take_per_row

# The chunked top k pays off from rows this many times k long (an 8,000-piece vocabulary and
# k = 4: two passes over chunks cost a third of TensorFlow's and XLA's full top k).
CHUNKED_FROM_ROW_LENGTH_PER_K = 4 * 32
# Chunk sizes tried, smallest first, for one that divides the vocabulary; else the vocabulary is
# padded to whole chunks of the fallback size.
CHUNK_SIZES = range(32, 129)
FALLBACK_CHUNK_SIZE = 64
# Up to this k, argmax passes (which XLA fuses) beat XLA's CPU top k, which sorts each row
# (1.8 ms against 0.04 ms at [128, 128] and k = 4); past it, a sort.
MAX_ARGMAX_PASSES = 16
# Over rows longer than this (a vocabulary), an argmax as the first position holding the
# maximum: plain reductions XLA's CPU backend vectorizes (XLA greedy +5-7%); over shorter rows
# (beam search's chunks) the argmax itself (the other form cost XLA beam 4 5.7%).
ARGMAX_BY_MIN_FROM_ROW_LENGTH = 1024


def best_tokens(logits, n, kernel):
    """The `n` most likely tokens of each row of `logits` `[rows, vocab]` and their
    log-probabilities, both `[rows, n]`, found by `kernel` (an `Execution.top_k`). Only the
    normaliser is computed over the whole vocabulary, not every log-probability."""
    best, tokens = top_k(logits, n, kernel)  # [rows, n] each
    # log_softmax's way, relative to the row's maximum, stays exact for near-certain tokens.
    shifted = best - best[:, :1]
    log_normaliser = ops.log(ops.sum(ops.exp(logits - best[:, :1]), axis=-1, keepdims=True))  # [rows, 1]
    return shifted - log_normaliser, ops.cast(tokens, "int32")


def token_log_probs(logits, tokens):
    """log P of one given token per row: `log_softmax(logits)[r, tokens[r]]`, float32 `[rows]`
    for `logits` `[rows, vocab]` and int `tokens` `[rows]` (a forced or a sampled token)."""
    chosen = take_per_row(logits, ops.cast(tokens, "int32")[:, None])[:, 0]  # [rows]
    return chosen - ops.logsumexp(logits, axis=-1)


def top_k(values, k, kernel):
    """`ops.top_k(values, k)` over `[rows, vocab]` by `kernel`: "sort", "chunks" or
    "chunks_by_argmax"."""
    if kernel == "sort":
        return ops.top_k(values, k)
    short_top_k = top_k_by_argmax if kernel == "chunks_by_argmax" else ops.top_k
    return chunked_top_k(values, k, short_top_k)


def chunked_top_k(values, k, short_top_k):
    """`top_k(values, k)` over `[rows, vocab]`, in two short passes over chunks of the
    vocabulary: the k best values lie in the k chunks with the best maxima. `short_top_k` finds
    the top k of the short rows: `ops.top_k`, or `top_k_by_argmax`."""
    vocab = values.shape[-1]  # None where it varies by request (a shortlist's): a full top k
    if k == 1 or vocab is None or vocab < CHUNKED_FROM_ROW_LENGTH_PER_K * k:
        return short_top_k(values, k)
    chunk = next((size for size in CHUNK_SIZES if vocab % size == 0), FALLBACK_CHUNK_SIZE)
    padding = -vocab % chunk
    if padding:
        values = ops.pad(values, ((0, 0), (0, padding)), constant_values=float("-inf"))
    chunks = ops.reshape(values, (-1, (vocab + padding) // chunk, chunk))  # [rows, chunks, chunk]
    _, best_chunks = short_top_k(ops.max(chunks, axis=-1), k)  # [rows, k]
    candidates = take_per_row(chunks, best_chunks)  # [rows, k, chunk]
    best, position = short_top_k(ops.reshape(candidates, (-1, k * chunk)), k)  # [rows, k]
    chunk_of = take_per_row(best_chunks, position // chunk)  # [rows, k]
    return best, chunk_of * chunk + position % chunk


def top_k_by_argmax(values, k):
    """`ops.top_k(values, k)` over `[rows, n]` as k passes of argmax, each masking the value it
    found: for XLA, whose CPU top k sorts each row. Equal values come in index order."""
    if k > MAX_ARGMAX_PASSES:
        return ops.top_k(values, k)
    n = values.shape[-1]
    positions = ops.arange(n, dtype="int32")
    best, indices = [], []
    for _ in range(k):
        best.append(ops.max(values, axis=-1, keepdims=True))  # [rows, 1]
        if n > ARGMAX_BY_MIN_FROM_ROW_LENGTH:
            index = ops.min(ops.where(values == best[-1], positions, n - 1), axis=-1, keepdims=True)
        else:
            index = ops.cast(ops.argmax(values, axis=-1), "int32")[:, None]
        indices.append(index)  # [rows, 1]
        if len(indices) < k:
            values = ops.where(positions == index, float("-inf"), values)
    return ops.concatenate(best, axis=1), ops.concatenate(indices, axis=1)
