"""Where each output piece looked in the source: the encoder-decoder attention of a decoder layer
over the output a search produced, averaged over its heads (the paper's figures 3-5 show such
weights), for terminology checks, highlighting, or putting tags back."""

from keras import ops

from keras_transformer.common import BOS_ID, PAD_ID


def alignments(model, source_ids, tokens, layer=-1):
    """The attention `[batch, out_len, source_len]` of `tokens`' positions to the source.

    Row i holds the weights with which the decoder layer's encoder-decoder attention, averaged
    over its heads, read the source while producing output token i (its input: BOS, then the
    tokens before i). A row sums to 1 over the real source tokens (the end of sentence among
    them) and is 0 on source padding; rows past an output's length are 0. One full forward pass
    of the decoder: the cached search computed the same weights step by step.

    Args:
        model: a `Transformer`.
        source_ids: int32 `[batch, source_len]`, padded with 0, as the search read them.
        tokens: int32 `[batch, out_len]`, a search's output (no BOS or EOS), padded with 0.
        layer: which decoder layer's attention (Python index: -1 is the last).
    """
    check_layer(model, layer)
    tokens = ops.convert_to_tensor(tokens, "int32")
    batch = ops.shape(tokens)[0]
    inputs = ops.concatenate([ops.full((batch, 1), BOS_ID, "int32"), tokens[:, :-1]], axis=1)  # [batch, out_len]
    weights = model.cross_attention_weights(source_ids, inputs)[layer]  # [batch, heads, out_len, source_len]
    produced = ops.cast(tokens != PAD_ID, "float32")[:, :, None]  # [batch, out_len, 1]
    return ops.mean(ops.cast(weights, "float32"), axis=1) * produced


def check_layer(model, layer):
    """Raises ValueError unless `layer` indexes `model`'s decoder layers."""
    layers = model.config.decoder_layers
    if not -layers <= layer < layers:
        raise ValueError(f"alignment_layer {layer}: the decoder has {layers} layers (-{layers} to {layers - 1}).")
