"""Where an export (a SavedModel version folder of `python -m export`) keeps its files beside the
model, and its metadata's target languages, named once: `python -m export` writes them,
export.translate and the benchmarks read them."""

import json
import os

# How the export was made: the run, its checkpoint, the decoding settings, the shortlist
# (export/README.md).
METADATA = os.path.join("assets", "metadata.json")
# Its key of the target languages the export writes, its default first.
TARGET_LANGUAGES = "target_languages"
# The requests TF Serving replays when it loads a version, before it serves it, so that the first
# user request does not pay the graph's set-up.
WARMUP_REQUESTS = os.path.join("assets.extra", "tf_serving_warmup_requests")


def read_metadata(export_dir):
    """The export's metadata.json, as a dict."""
    with open(os.path.join(export_dir, METADATA), encoding="utf-8") as f:
        return json.load(f)


def target_languages(metadata):
    """The target languages an export of `metadata` (its metadata.json) writes, its default first:
    an export without the key writes its `target_lang` alone."""
    return metadata.get(TARGET_LANGUAGES) or [metadata["target_lang"]]
