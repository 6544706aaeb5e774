"""A limit on the source's length per request (CTranslate2's `max_input_length`): a longer source
is cut, never refused, its last kept token replaced by the end of sentence, and the caller told
which sentences were cut."""

from keras import ops

from keras_transformer.common import EOS_ID, PAD_ID


def cut(source_ids, max_input_length):
    """`source_ids` int32 `[batch, source_len]` (each ending with the end of sentence, padded
    with 0) with each source longer than `max_input_length` tokens (int, or int32 `[batch]`; 0:
    no limit) cut to that many, the end of sentence last; and bool `[batch]`, which were cut."""
    if isinstance(max_input_length, int) and max_input_length == 0:
        return source_ids, ops.zeros((ops.shape(source_ids)[0],), "bool")
    length = ops.sum(ops.cast(source_ids != PAD_ID, "int32"), axis=1, keepdims=True)  # [batch, 1]
    limit = ops.reshape(ops.convert_to_tensor(max_input_length, "int32"), (-1, 1))  # [batch or 1, 1]
    limit = ops.where(limit > 0, ops.minimum(limit, length), length)  # [batch, 1]
    position = ops.arange(ops.shape(source_ids)[1], dtype="int32")[None]
    kept = ops.where(position < limit - 1, source_ids, PAD_ID)
    return ops.where(position == limit - 1, EOS_ID, kept), limit[:, 0] < length[:, 0]
