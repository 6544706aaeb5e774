"""The sentences a search still decodes. With `Execution.drop_finished` the model stops decoding
a sentence once it is done, as CTranslate2 does, so a batch costs what its unfinished sentences
cost; the search's own state keeps every sentence of the batch."""

from keras import ops


def to_batch(rows, active, batch, k, execution):
    """`[a * k, n]` values of the active sentences' k outputs each -> `[batch, k, n]`, 0 for the
    other sentences (done: the search ignores what they get)."""
    per_sentence = ops.reshape(rows, (-1, k, rows.shape[-1]))  # [a, k, n]
    if not execution.drop_finished:  # every sentence is active
        return per_sentence
    return ops.scatter(active[:, None], per_sentence, (batch, k, rows.shape[-1]))


def next_active(model, execution, cache, parent, done, active):
    """The sentences the model decodes next (with `execution.drop_finished`, those of `active`
    not `done`), and the cache reordered for them: output i of each continues `parent[b, i]`
    (int `[batch, k]`)."""
    if not execution.drop_finished:
        return active, model.reorder_cache(cache, parent)
    kept = ops.cast(ops.nonzero(~ops.take(done, active))[0], "int32")  # [a']: positions among the active
    active = ops.take(active, kept)  # [a']: sentence indices
    return active, model.reorder_cache(cache, ops.take(parent, active, axis=0), kept)
