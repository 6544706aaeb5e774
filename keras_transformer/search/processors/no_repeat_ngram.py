"""No n-gram twice in an output (fairseq's `--no-repeat-ngram-size`, CTranslate2's
`no_repeat_ngram_size`): a row may not take a token that would complete an n-gram of its output
tokens that it has output before. n = 1 bans every token output already; 0 bans nothing."""

from keras import ops

from keras_transformer.search.processors import ban, token_mask


def process(log_probs, step, size):
    """`size`: int n, or int32 `[rows]` (0: off).

    The output's n-gram that ends at position j + 1 (1 <= j + 2 - n, j + 1 <= index) repeats the
    one the step would complete when its first n - 1 tokens, positions j + 2 - n to j, equal the
    row's last n - 1, positions index + 2 - n to index: then its last token, at j + 1, is banned.
    An n above `index` completes nothing yet, so the loop stops there whatever n a request sends.
    """
    tokens, index = step.tokens, ops.convert_to_tensor(step.index, "int32")
    rows, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    size = ops.broadcast_to(ops.convert_to_tensor(size, "int32"), (rows,))[:, None]  # [rows, 1]
    j = ops.arange(length, dtype="int32")[None]  # [1, length]: where an earlier (n - 1)-gram ends
    complete = (j + 2 - size >= 1) & (j + 1 <= index) & (size >= 1)  # [rows, length]

    def compare(m, carry):  # the (n - 1)-grams agree on their last m + 1 tokens
        matched, banned = carry
        earlier = ops.take(tokens, ops.maximum(j[0] - m, 0), axis=1)  # [rows, length]: position j - m
        matched = matched & (earlier == ops.take(tokens, ops.maximum(index - m, 0), axis=1)[:, None])
        return matched, banned | (matched & (size - 2 == m))

    start = ops.ones((rows, length), "bool")
    _, banned = ops.fori_loop(0, ops.minimum(ops.max(size), index) - 1, compare, (start, complete & (size == 1)))
    following = ops.take(tokens, ops.minimum(j[0] + 1, length - 1), axis=1)  # [rows, length]: position j + 1
    return ban(log_probs, token_mask(following, banned & complete, ops.shape(log_probs)[-1]))
