"""The search loop: `state = step(state)` while a condition holds, over a named state, under
TensorFlow (graphs, eager) and JAX.

Under JAX and XLA every tensor of the state keeps its shape. A TensorFlow graph without XLA lets
shapes change (a growing cache, the sentences a search stops decoding), along the axes the loop
declares (`tf.while_loop`'s shape invariants). The axes that a search grows start empty (a cache
of no positions yet), so the loop frees the axes of size 0 and traces `step` once. If a step
changes another axis (it drops finished sentences from a batch of static size), tf.while_loop
refuses that, and the loop finds the axes that a step changes by tracing it on the state's shapes,
then frees exactly those. So no field need say what its axes are, and no axis is freed that a step
keeps (a vocabulary). `graph_function` traces a search into a TensorFlow graph.
"""

import keras
from keras import ops


def while_loop(condition, step, state, maximum_iterations):
    """Runs `state = step(state)` while `condition(state)`, at most `maximum_iterations` times.

    Args:
        condition: state -> scalar bool.
        step: state -> state of the same structure and dtypes.
        state: a namedtuple of tensors, nested tuples, lists or namedtuples of them, and None.
        maximum_iterations: an int or int scalar.

    Returns:
        The last state.
    """
    if keras.config.backend() != "tensorflow":
        kind = type(state)  # keras.ops.while_loop passes a tuple's items as arguments

        def body(*fields):
            return tuple(step(kind(*fields)))

        fields = ops.while_loop(lambda *fields: condition(kind(*fields)), body, tuple(state), maximum_iterations=maximum_iterations)
        return kind(*fields)
    import tensorflow as tf

    # tf.while_loop carries tensors only: the Nones of the state stay outside.
    leaves = tf.nest.flatten(state)
    carried = [i for i, leaf in enumerate(leaves) if leaf is not None]

    def rebuild(tensors):
        full = [None] * len(leaves)
        for i, tensor in zip(carried, tensors):
            full[i] = tensor
        return tf.nest.pack_sequence_as(state, full)

    def flat_step(*tensors):
        new = tf.nest.flatten(step(rebuild(tensors)))
        return tuple(new[i] for i in carried)

    tensors = tuple(leaves[i] for i in carried)

    def loop(**shape_invariants):
        return rebuild(tf.while_loop(lambda *tensors: condition(rebuild(tensors)), flat_step, tensors,
                                     maximum_iterations=maximum_iterations, **shape_invariants))  # fmt: skip

    if not tf.inside_function():
        return loop()
    try:
        return loop(shape_invariants=tuple(tf.TensorShape([None if n == 0 else n for n in t.shape]) for t in tensors))
    except ValueError:  # a step changed an axis of nonzero size
        return loop(shape_invariants=_shape_invariants(flat_step, tensors))


def graph_function(function=None, **kwargs):
    """`tf.function(function, **kwargs)` (or its decorator) without AutoGraph, for searches: their
    loops are this module's `tf.while_loop` and their branches `tf.cond` already, and AutoGraph's
    conversion of the search code took a fifth of an export's time."""
    import tensorflow as tf

    return tf.function(function, autograph=False, **kwargs)


def _shape_invariants(flat_step, tensors):
    """The shapes that `flat_step`'s inputs keep from step to step: those of `tensors` with each
    axis that one step, traced on them, changes unknown. (A step that changed another axis of them
    would make tf.while_loop refuse them.)"""
    import tensorflow as tf

    specs = [tf.TensorSpec(tensor.shape, tensor.dtype) for tensor in tensors]
    outputs = tf.nest.flatten(graph_function(flat_step).get_concrete_function(*specs).structured_outputs)
    return tuple(tensor.shape.most_specific_compatible_shape(output.shape) for tensor, output in zip(tensors, outputs))
