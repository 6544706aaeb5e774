import dataclasses
import os
import re

import pytest

from conftest import ROOT
from keras_transformer import TransformerConfig
from keras_transformer.config import PRESETS


def test_presets_hold_the_paper_values():
    base = TransformerConfig.base(37000)
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout) == (6, 512, 2048, 8, 0.1)
    big = TransformerConfig.big(37000)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout) == (6, 1024, 4096, 16, 0.3)
    assert TransformerConfig.preset("tiny", 100, num_layers=1).num_layers == 1
    small = TransformerConfig.preset("small", 8000)  # the benchmarks' small config (bench/README.md)
    assert (small.num_layers, small.d_model, small.d_ff, small.num_heads) == (3, 256, 1024, 4)
    narrow = TransformerConfig.preset("multi30k", 8000)  # bench.multi30k's recipe (bench/README.md)
    assert (narrow.num_layers, narrow.d_model, narrow.d_ff, narrow.num_heads, narrow.dropout) == (4, 128, 512, 4, 0.3)
    shallow = TransformerConfig.preset("multi30k_shallow", 8000)  # its deep-encoder, shallow-decoder variant
    assert (shallow.encoder_layers, shallow.decoder_layers, shallow.num_layers, shallow.dropout) == (4, 1, None, 0.2)
    assert dataclasses.replace(shallow, decoder_layers=4, dropout=0.3) == narrow
    assert TransformerConfig.preset("multi30k_shallow", 8000, num_layers=2).decoder_layers == 2  # the shorthand wins


def test_each_preset_has_a_constructor_of_its_name_with_its_model():
    for name, preset in PRESETS.items():
        config = getattr(TransformerConfig, name)(8000)
        assert config == TransformerConfig.preset(name, 8000), name
        assert {field: getattr(config, field) for field in preset["model"]} == preset["model"], name
        assert getattr(TransformerConfig, name)(8000, d_model=64).d_model == 64, name


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=100, num_heads=8), "d_model=100 is not divisible by num_heads=8"),
        (dict(num_layers=0), "encoder_layers must be a positive integer, got 0"),
        (dict(decoder_layers=0), "decoder_layers must be a positive integer, got 0"),
        (dict(num_layers=2, encoder_layers=3, decoder_layers=1), "num_layers=2 is the depth of a stack whose own"),
        (dict(d_ff=-5), "d_ff must be a positive integer, got -5"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (dict(attention_dropout=-0.1), r"attention_dropout must be in \[0, 1\), got -0.1"),
        (dict(positional_encoding="rotary"), "got 'rotary'"),
        (dict(activation="gelu"), r"activation must be one of \('relu', 'swish'\), got 'gelu'"),
        (dict(layer_norm_epsilon=0.0), r"layer_norm_epsilon must be in \(0, 1\), got 0.0"),
        (dict(source_vocab_size=0), "source_vocab_size must be a positive integer, got 0"),
    ],
)
def test_invalid_settings_name_the_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.base(1000, **overrides)


def test_unknown_preset_and_fields_are_rejected():
    with pytest.raises(ValueError, match="Unknown config 'huge'"):
        TransformerConfig.preset("huge", 100)
    with pytest.raises(ValueError, match="d_modle"):
        TransformerConfig.from_dict({"vocab_size": 10, "d_modle": 8})


def test_num_layers_is_the_shorthand_for_both_depths_and_an_older_config_json_loads():
    config = TransformerConfig.preset("multi30k", 8000, decoder_layers=1)
    assert (config.encoder_layers, config.decoder_layers, config.num_layers) == (4, 1, None)
    # The shorthand replaces a preset's depths; a stack's own field wins over it.
    config = TransformerConfig.preset("multi30k", 8000, num_layers=2, encoder_layers=5)
    assert (config.encoder_layers, config.decoder_layers) == (5, 2)
    assert TransformerConfig.base(100).num_layers == 6
    assert dataclasses.replace(TransformerConfig.tiny(100), d_model=64).num_layers == 2
    # A config.json of a run trained before the two depths has num_layers alone.
    old = {"vocab_size": 50, "num_layers": 3, "d_model": 32, "num_heads": 2, "d_ff": 64}
    loaded = TransformerConfig.from_dict(old)
    assert (loaded.encoder_layers, loaded.decoder_layers) == (3, 3)
    assert loaded == TransformerConfig.from_dict(loaded.to_dict()) and "num_layers" not in loaded.to_dict()
    # Nor has it Marian's options: it has the paper's.
    assert (loaded.activation, loaded.positional_encoding, loaded.layer_norm_epsilon, loaded.logits_bias) == (
        "relu", "sinusoidal", 1e-6, False)


def test_json_round_trip():
    config = TransformerConfig.tiny(123, positional_encoding="learned")
    assert TransformerConfig.from_json(config.to_json()) == config


def test_the_readme_lists_every_preset():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    listed = re.findall(r"`--config (\w+(?:\|\w+)+)`", readme)
    assert [names.split("|") for names in listed] == [list(PRESETS)]
    (row,) = re.findall(r"^\| [^|]* \| `keras_transformer/config.py` \|.*$", readme, re.MULTILINE)  # the paper's table
    assert [name for name in PRESETS if not re.search(rf"\b{name}\b", row)] == []
