"""The table of request inputs and the signatures' declarations (export/signatures.py), without an
export: test_export.py serves them."""

import argparse

import numpy as np
import pytest

from export import signatures
from export.signatures import INPUT, INPUTS, SIGNATURE, SIGNATURES, readme_with_tables
from keras_transformer.search import OPTIONS, SAMPLING_OPTIONS, DecodingSettings

# What exports of one and of several target languages offer their inputs' choices (`Input.choices`).
ONE, SEVERAL = {"target_languages": ["de"]}, {"target_languages": ["de", "fr"]}


def test_every_signature_declares_its_inputs_as_rows_of_the_one_table():
    names = [row.name for row in INPUTS]
    assert len(set(names)) == len(names)
    for signature in SIGNATURES:
        assert all(INPUT[row.name] is row for row in signature.inputs), signature.name
        with_default = [row.has_default for row in signature.inputs]
        assert with_default == sorted(with_default), f"{signature.name}: the inputs with a default come last"
        assert signature.inputs[0] is INPUT["text"] and INPUT["target_language"] in signature.inputs  # every text's
        assert signature.served_inputs(SEVERAL) == signature.inputs  # in an export of several languages only
        assert signature.served_inputs(ONE) == tuple(row for row in signature.inputs if row.name != "target_language")
    assert [row.name for row in SIGNATURE["options"].inputs] == ["text", "target_language", *(o.name for o in OPTIONS)]
    assert [row.name for row in SIGNATURE["sample"].inputs] == ["text", "samples", "temperature", "top_k", "top_p", "seed",
                                                                "target_language"]  # fmt: skip
    assert SIGNATURE["score"].inputs[3] is INPUT["alpha"] and INPUT["alpha"].option is OPTIONS[1]


def test_every_float_input_refuses_inf_and_nan_by_name():
    floats = [row for row in INPUTS if row.kind.served_dtype == "float32"]
    assert {row.name for row in floats} == {"temperature", "top_p", "alpha", "max_length_a", "repetition_penalty"}
    for row in floats:
        assert "finite" in row.valid or row.valid.endswith("1]"), row.name  # the words say the range is finite
        assert not np.any(row.check(np.array([np.inf, -np.inf, np.nan], np.float32))), row.name
        with pytest.raises(ValueError, match=f"--{row.name} must be"):
            row.check_value(float("nan"), f"--{row.name}")


@pytest.mark.parametrize("beam_size", [1, 4])
def test_each_warmup_request_is_valid_by_its_rows_in_an_export_of_that_beam(beam_size):
    text = np.array([b"a b", b"c"], object)
    settings = DecodingSettings(beam_size=beam_size)
    for signature in SIGNATURES:
        request = signature.warmup(text, settings, SEVERAL)
        assert list(request) == [row.name for row in signature.inputs]
        for row in signature.inputs:
            value = request[row.name]
            assert len(value) == len(text), (signature.name, row.name)
            if row.check is not None:
                assert np.all(row.check(value)), (signature.name, row.name, value)
            if row.bound:
                assert np.all(value <= getattr(settings, row.bound)), (signature.name, row.name)
    assert np.all(SIGNATURE["options"].warmup(text, settings, ONE)["beam_size"] == min(2, beam_size))
    assert SIGNATURE["score"].warmup(np.array([b"a"] * 3, object), settings, SEVERAL)["target_language"].tolist() == [
        b"de", b"fr", b"de"]  # each served language, in turn  # fmt: skip


def test_a_bounded_input_names_the_exports_bound():
    INPUT["n"].check_value(4, "--n-best", most=4)
    with pytest.raises(ValueError, match=r"--n-best must be 1 to the beam size: at most 4 in this export; got 5\."):
        INPUT["n"].check_value(5, "--n-best", most=4)
    with pytest.raises(ValueError, match=r"--sample must be 1 to 100; got 0\."):
        INPUT["samples"].check_value(0, "--sample")


def test_the_sampling_flags_come_from_the_sampling_rows():
    parser = argparse.ArgumentParser()
    SIGNATURE["sample"].add_flags(parser, parser.add_mutually_exclusive_group())
    args = parser.parse_args(["--sample", "3", "--top-k", "5"])
    assert (args.sample, args.top_k, args.seed) == (3, 5, 0)
    assert {option.name: getattr(args, option.name) for option in SAMPLING_OPTIONS} == {
        "temperature": 1.0, "top_k": 5, "top_p": 1.0}  # fmt: skip
    args.top_p = 0.0
    with pytest.raises(ValueError, match=r"--top-p must be in \(0, 1\]; got 0\.0\."):
        SIGNATURE["sample"].prepare(args, "unused", [])


def test_the_readme_tables_are_the_declarations_and_the_command_rewrites_a_stale_one():
    with open(signatures.README, encoding="utf-8") as f:
        readme = f.read()
    assert readme_with_tables(readme) == readme, "export/README.md is stale: run python -m export.signatures"
    row = INPUT["n"].row()
    assert row in readme
    stale = readme.replace(row + "\n", "")
    assert stale != readme and readme_with_tables(stale) == readme
    # A signature without its own line (a new one) gets its name and table in the section of OTHERS.
    moved = readme_with_tables(readme.replace("<!-- signature n_best -->\n", ""))
    others = moved.partition(signatures.OTHERS[0])[2].partition(signatures.OTHERS[1])[0]
    assert f"\n`n_best` (`loaded.n_best`):\n\n{SIGNATURE['n_best'].table()}\n" in others
    with pytest.raises(ValueError, match="no lines '<!-- signatures without a section of their own -->' and then"):
        readme_with_tables(readme.replace(signatures.OTHERS[1], ""))
