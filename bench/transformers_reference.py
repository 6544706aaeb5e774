"""The transformers rows of bench/decode.py `--marian`: transformers' MarianMTModel (PyTorch) on the
same OPUS-MT model in Hugging Face's form (bench/marian_release.py `write_hugging_face`), what
users of OPUS-MT models run in Python, on all host threads.

transformers and PyTorch are bench-only, optional dependencies (`pip install torch
transformers`); without them the rows are skipped with a message.
"""

import os

from training import marian


def available():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def translator(folder):
    """transformers' MarianMTModel of the Hugging Face folder `folder`, for inference."""
    import torch
    from transformers import MarianMTModel

    torch.set_num_threads(os.cpu_count())
    return MarianMTModel.from_pretrained(folder).eval()


def translate(model, source_ids, beam_size, length, forced=False):
    """Output ids (ours) of `generate` for our int `source_ids` `[batch, source_len]` (each
    ending with the end of sentence, no padding), at most `length` tokens each; with `forced`,
    exactly `length` (the end of sentence suppressed before), as bench/decode.py times our
    search. No length penalty; <pad>, which starts the decoder, never generated (OPUS-MT's
    configs ban it)."""
    import torch

    theirs = marian.marian_id(source_ids)
    pad = model.config.pad_token_id
    with torch.inference_mode():
        outputs = model.generate(input_ids=torch.as_tensor(theirs), attention_mask=torch.ones(theirs.shape, dtype=torch.long),
                                 num_beams=beam_size, do_sample=False, length_penalty=0.0, max_new_tokens=length,
                                 min_new_tokens=length if forced else 0, bad_words_ids=[[pad]])  # fmt: skip
    tokens = []
    for row in outputs[:, 1:].numpy():  # after the decoder's start
        ended = [i for i, t in enumerate(row) if t in (marian.MARIAN_EOS, pad)]
        tokens.append([int(marian.our_id(t)) for t in row[: ended[0] if ended else len(row)]])
    return tokens
