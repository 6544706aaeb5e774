"""How a search runs, apart from what it computes: `Execution`, chosen per backend, compile mode
and device. Every choice gives the same tokens (tests/test_search.py compares them); they differ
in speed, and in what a compiler allows.
"""

import dataclasses

import keras

CACHES = ("growing", "static")
TOP_K_KERNELS = ("sort", "chunks", "chunks_by_argmax")  # keras_transformer/search/top_k.py


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a search runs.

    Args:
        cache: "growing" (each step appends; shapes change, as a TensorFlow graph without XLA
            allows) or "static" (preallocated for the longest output; fixed shapes, as XLA, JAX
            and TPUs need). keras_transformer/cache.py.
        shared_slots: beam search keeps a sentence's hypotheses in slots of one cache row and
            reorders a table of where each one's past is, rather than copying every layer's keys
            and values of the hypotheses it keeps.
        drop_finished: a search stops decoding a sentence once it is done, so a batch costs
            what its unfinished sentences cost (the growing cache only: it changes shapes).
        top_k: how a step finds each hypothesis's best tokens: "sort" (`ops.top_k` over the
            vocabulary), "chunks" (two short passes over vocabulary chunks), "chunks_by_argmax"
            (the same, each short top k as argmax passes). keras_transformer/search/top_k.py.
    """

    cache: str = "growing"
    shared_slots: bool = True
    drop_finished: bool = True
    top_k: str = "chunks"

    def __post_init__(self):
        if self.cache not in CACHES or self.top_k not in TOP_K_KERNELS:
            raise ValueError(f"Execution: cache is one of {CACHES} and top_k one of {TOP_K_KERNELS}; got {self}.")
        if self.cache == "static" and self.drop_finished:
            raise ValueError("Execution: drop_finished changes the batch's shape, which the static cache keeps fixed.")

    @classmethod
    def choose(cls, compiled=None, platform=None):
        """The execution for a search compiled by XLA or not (default: under JAX, which always
        compiles) on `platform` ("cpu", "gpu", "tpu"; default: the backend's default device).

        Only what was measured on a platform is its default there, each choice for a gain of
        10% or more on a path users run (bench/README.md's decoding section). On CPUs: shared
        slots, the served graph's beam 4 at batch 32 1.12-1.16x (even under XLA); dropping
        finished sentences, the same +62%; the chunked top k, served +14%; its short top k as
        argmax passes, the XLA export's beam 4 1.9-2.2x on a 500-piece vocabulary (even at
        8,000). Nothing was measured on GPUs and TPUs: they get the plain choices.
        """
        if keras.config.backend() == "jax":
            if compiled is False:
                raise ValueError("Under JAX a search is always compiled (its loop needs fixed shapes).")
            compiled = True
        compiled = bool(compiled)
        cache = "static" if compiled else "growing"
        if (platform or default_platform()) == "cpu":
            return cls(cache, shared_slots=True, drop_finished=not compiled,
                       top_k="chunks_by_argmax" if compiled else "chunks")  # fmt: skip
        return cls(cache, shared_slots=False, drop_finished=False, top_k="sort")


def default_platform():
    """"cpu", "gpu" or "tpu": where Keras' backend runs by default."""
    if keras.config.backend() == "jax":
        import jax

        return jax.default_backend()
    import tensorflow as tf

    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
