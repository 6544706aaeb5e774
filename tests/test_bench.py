"""Each benchmark runs in its seconds-long smoke mode and prints well-formed JSON lines."""

import json
import subprocess
import sys

import pytest

REQUIRED = {
    "bench.decode": {"mode", "beam_size", "xla", "gen_tokens_per_s", "peak_rss_mb"},
    "bench.train_throughput": {"config", "xla", "tgt_tokens_per_s", "peak_rss_mb", "fraction_of_matmul"},
    "bench.serving": {"beam_size", "batch", "cold_start_s", "p50_ms", "p95_ms", "peak_rss_mb"},
    "bench.multi30k": {"bleu", "signature", "chrf", "bleu_last_checkpoint", "steps", "wall_seconds", "peak_rss_mb"},
}


# These two train a model for a few steps first: end to end, so marked slow.
TRAINING = {"bench.serving", "bench.multi30k"}


@pytest.mark.parametrize(
    "module", [pytest.param(name, marks=[pytest.mark.slow] if name in TRAINING else []) for name in sorted(REQUIRED)]
)
def test_benchmark_smoke_mode_prints_json_lines(module):
    output = subprocess.run(
        [sys.executable, "-m", module, "--smoke"], check=True, capture_output=True, text=True, timeout=600
    ).stdout
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert records, output
    for record in records:
        assert REQUIRED[module] <= set(record), record
        assert all(record[key] > 0 for key in record if key.endswith("_per_s") or key == "peak_rss_mb")
