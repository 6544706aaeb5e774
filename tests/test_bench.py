"""Each benchmark of bench/smoke.py's registry runs in its seconds-long smoke mode (all in one
process: `python -m bench --smoke`) and prints JSON lines of its own with the registry's keys."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bench import ctranslate2_reference, multi30k, smoke
from conftest import loaded_export
from training import languages, learning_curve
from training.run_folder import RunFolder

@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory):
    """`python -m bench --smoke`: every benchmark's smoke mode, those that need none of the suite's
    shared artifacts in one process while the artifacts are made (tests/conftest.py), then the
    others in another, on the shared run and exports (bench/smoke.py's variables, set by the
    artifacts fixture). Returns ({module: its output lines}, standard error, the folder of their
    run folders)."""
    runs = tmp_path_factory.mktemp("bench-runs")
    outputs, stderr, module = {}, "", None
    for shared in (False, True):
        if shared:
            request.getfixturevalue("artifacts")
        names = [f"bench.{name}" for name, benchmark in smoke.BENCHMARKS.items() if benchmark.shared == shared]
        result = subprocess.run([sys.executable, "-m", "bench", "--smoke", *names, "--runs", str(runs)], capture_output=True,
                                text=True, timeout=1800)  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
        stderr += result.stderr
        for line in result.stdout.splitlines():
            if line.startswith("== "):
                module = line[3:]
                outputs[module] = []
            elif module:
                outputs[module].append(line)
    return outputs, stderr, runs


# Each runs its whole benchmark (several processes for some; some train for a few steps): slow.
@pytest.mark.slow
@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("module", [f"bench.{name}" for name in sorted(smoke.BENCHMARKS)])
def test_benchmark_smoke_mode_prints_json_lines(module, smoke_runs, artifacts):
    outputs, stderr, runs = smoke_runs
    output = "\n".join(outputs[module])
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    name = module.removeprefix("bench.")
    own = [record for record in records if record["benchmark"] == name]  # not its summaries and ratios
    assert own, output
    for record in own:
        assert smoke.BENCHMARKS[name].keys <= set(record), record
    for record in records:
        assert all(record[key] > 0 for key in record if key.endswith("_per_s") or key == "peak_rss_mb")
    if module == "bench.real_serving":  # each system measured (its speed, latency and BLEU: the keys); each ratio both BLEUs
        ours, int8 = (f"{os.path.basename(artifacts.tf_run)}/{kind}" for kind in ("export", "ctranslate2_int8"))
        (cold,) = [r for r in own if r["system"] == ours]  # ours started as a server: load, warm-up, first request
        assert cold["load_s"] > 0 and cold["warmup_s"] > 0 and cold["first_request_ms"] > 0
        if "CTranslate2 is not installed" in stderr:
            pytest.skip("bench.real_serving's CTranslate2 rows: CTranslate2 is not installed (export/requirements.txt)")
        assert {r["system"] for r in own} == {ours, int8}  # smoke: int8
        speeds = {(r["round"], r["system"]): r["sentences_per_s"] for r in own}
        ratios = [r for r in records if r["benchmark"] == "real_serving_ratio"]
        assert [(r["ours"], r["other"]) for r in ratios] == [(ours, int8)]
        for r in ratios:  # each ratio is the two systems' speeds of its round, not a constant
            assert {"bleu_ours", "bleu_other"} <= set(r) and 0 <= r["identical"] <= 1
            assert r["ratio"] == pytest.approx(speeds[r["round"], r["ours"]] / speeds[r["round"], r["other"]], rel=0.01)
        (summary,) = [r for r in records if r["benchmark"] == "real_serving_summary"]
        assert summary["median_ratio"] == ratios[0]["ratio"] and summary["rounds"] == 1
    if module == "bench.decode":  # with the smoke's shortlist of 20, each of ours also over all 50 pieces
        ours = [r for r in own if r["mode"] in ("served", "cached")]
        assert {(r["mode"], r["candidates"]) for r in ours if not r["marian"]} == {
            (mode, n) for mode in ("served", "cached") for n in (20, 50)}
        summaries = [r for r in records if r["benchmark"] == "decode_vs_ctranslate2"]  # each ratio of one round's rows
        assert {"served_beam4_graph_shortlist_vs_full", "cached_beam1_xla_shortlist_vs_full"} <= set(summaries[0])
        # Then an OPUS-MT model of 50 pieces (52 of ours) against CTranslate2's own conversion of it, which gave our
        # greedy tokens (measure's check) before its rows.
        marian = {(r["mode"], r["beam_size"], r["candidates"]) for r in own if r["marian"]}
        if not ctranslate2_reference.available():
            assert marian == {("served", 1, 52), ("served", 4, 52)}
            pytest.skip("bench.decode's CTranslate2 rows: CTranslate2 is not installed (export/requirements.txt)")
        assert marian == {(mode, beam, 52) for mode in ("served", "ctranslate2") for beam in (1, 4)}, marian
        assert {"served_beam1_graph", "served_beam4_graph"} <= set(summaries[1])
    if module == "bench.compare_exports":  # the beam-4 export against the greedy one, then its options, 2 rounds each
        from keras_transformer.search import OPTIONS

        beam, greedy = artifacts.exports[4], artifacts.exports[1]
        rounds = [r["sentences_per_s_each"] for r in records if r["benchmark"] == "compare_exports"]
        summaries = [r for r in records if r["benchmark"] == "compare_exports_summary"]
        assert [set(speeds) for speeds in rounds[:2]] == [{beam, greedy}] * 2
        (summary,) = [r for r in summaries if r["baseline"] == beam]
        low, high = summary["ratio_range"]  # each round's ratio: its own two speeds
        assert summary["system"] == greedy and low <= summary["median_ratio"] <= high
        assert summary["median_ratio"] == pytest.approx(np.median([r[greedy] / r[beam] for r in rounds[:2]]), rel=0.01, abs=0.001)
        translations = [loaded_export(n).translate(tf.constant(smoke.SENTENCES))["translation"].numpy() for n in (beam, greedy)]
        same = np.mean(translations[0] == translations[1])
        assert same < 1, translations  # an export compared with itself would report 1
        assert summary["same_translations"] == pytest.approx(same)
        modes = {r["system"] for r in summaries if r["baseline"] == "serving_default"}  # every option measured alone
        assert modes == {"options, none set", "options, all set", "score", *(f"options, {o.name}" for o in OPTIONS)}
        assert len(rounds) == 4 and all(set(speeds) == modes | {"serving_default"} for speeds in rounds[2:])
        for summary in (r for r in summaries if r["baseline"] == "serving_default"):
            ratios = [speeds[summary["system"]] / speeds["serving_default"] for speeds in rounds[2:]]
            assert summary["ratio_range"][0] == pytest.approx(min(ratios), rel=0.01, abs=0.001)
    if module == "bench.multihost":
        (record,) = records
        one, two = (record[f"{name}_tgt_tokens_per_s_per_device"] for name in ("one_process_4_devices", "two_processes_2_devices"))
        assert record["ratio"] == pytest.approx(two / one, rel=0.01, abs=0.001)  # printed to 3 decimals
    if module == "bench.multi30k":  # the learning curve has dev points, and metrics.json the extra figures
        assert records[0]["learning_curve"] == str(runs / "multi30k" / "learning_curve.png")
        assert (runs / "multi30k" / "learning_curve.png").read_bytes().startswith(b"\x89PNG")
        # Dev points after 2-step calls once 0.001 minutes have passed since the last (--eval-every-minutes 0.001): after
        # step 2, and after step 4 unless that call took under 60 ms. Not after the last call.
        assert len(learning_curve.curve(runs / "multi30k")[3]) in (1, 2)
        metrics = json.loads((runs / "multi30k" / "metrics.json").read_text())
        assert {key: metrics[key] for key in ("bleu_lowercase", "dev_bleu", "dev_bleu_lowercase")} == {
            key: records[0][key] for key in ("bleu_lowercase", "dev_bleu", "dev_bleu_lowercase")}
        assert "lc" in metrics["bleu_lowercase_signature"] and "mixed" in metrics["signature"]
        # Val chose the checkpoint at the paper's decoding, then the beam size and alpha for it.
        tried = metrics["dev_tried"]
        assert [(row["checkpoint"], row["beam_size"], row["alpha"]) for row in tried[:2]] == [
            ("averaged", 4, 0.6), ("last", 4, 0.6)]
        assert [(row["beam_size"], row["alpha"]) for row in tried[2:]] == list(multi30k.DECODING_GRID)
        assert {row["checkpoint"] for row in tried[2:]} == {metrics["dev_checkpoint"]}
        best = max(tried, key=lambda row: row["bleu"])
        assert (metrics["dev_bleu"], metrics["beam_size"], metrics["alpha"]) == (best["bleu"], best["beam_size"], best["alpha"])
        assert records[0]["dev_bleu_last_checkpoint"] == tried[1]["bleu"]
        assert sorted(p.name for p in (runs / "multi30k").glob("translations.*")) == ["translations.dev.txt", "translations.test.txt"]
    if module == "bench.finetune":  # the three rows; the general model, before and after, on its own test split too
        rows = {record["row"]: record for record in records}
        assert sorted(rows) == ["a_general_as_is", "b_finetuned", "c_from_scratch"]
        assert "multi30k_test_bleu" in rows["b_finetuned"] and "multi30k_test_bleu" not in rows["c_from_scratch"]
        tuned = RunFolder(rows["b_finetuned"]["run"])
        assert tuned.segments()[0]["settings"]["init_from"]["run"] == artifacts.tf_run and tuned.best()["file"]
        assert RunFolder(rows["c_from_scratch"]["run"]).segments()[0]["settings"]["init_from"] is None
    if module == "bench.multilingual":  # each bilingual model on its pair; the multilingual one on both, at T and 2T
        # (its served comparison is bench.compare_exports' smoke mode: here --batch-sizes none)
        rows = [(r["model"], r["budget"], r["pair"]) for r in records if r["benchmark"] == "multilingual"]
        assert rows == [("bilingual", "T", "en-de"), ("bilingual", "T", "en-qaa"), *(
            ("multilingual", budget, pair) for budget in ("T", "2T") for pair in ("en-de", "en-qaa"))]  # fmt: skip
        assert RunFolder(str(runs / "multilingual" / "en-de-qaa")).pairs() == (("en", "de"), ("en", "qaa"))
        # --average 2 of runs with a checkpoint at each of 2 steps: the multilingual one's at T (1 minute) is its first.
        both, first = ["ckpt-1", "ckpt-2"], ["ckpt-1"]
        assert [r["averaged"] for r in records if r["benchmark"] == "multilingual"] == [both, both, first, first, both, both]
        # Then --temperatures 5 with en-qaa cut to half: its batches' shares by the formula, each pair scored.
        studied = [r for r in records if r["benchmark"] == "pair_temperature"]
        assert [(r["temperature"], r["pair"], r["train_pairs"]) for r in studied] == [(5.0, "en-de", 300), (5.0, "en-qaa", 150)]
        shares = languages.pair_weights([300, 150], 5.0)
        assert [r["share_of_batches"] for r in studied] == pytest.approx(shares, abs=1e-4) and shares[1] > 1 / 3
        assert len((runs / "multilingual" / "data" / "en-qaa" / "train.qaa").read_text().splitlines()) == 150
        assert RunFolder(str(runs / "multilingual" / "temperature-5")).settings()["pair_temperature"] == 5.0
    if module == "bench.wmt14_recipe":  # 4 updates of 8 batches, the last 2 checkpoints averaged by training, scored both ways
        (record,) = records
        assert (record["updates"], record["accumulate_steps"], record["checkpoints"]) == (4, 8, [2, 4])
        assert record["averaged"] == ["ckpt-2", "ckpt-4"] and "tok:moses-de" in record["bleu_paper_signature"]
    if module == "bench.train_throughput":  # every backend's row, in one run
        assert {(r["backend"], r["xla"]) for r in records} >= {("tensorflow", False), ("tensorflow", True), ("jax", True)}


@pytest.mark.slow
def test_a_multi30k_probe_scores_val_and_leaves_the_test_split_unread(tmp_path, capsys):
    (flags,) = smoke.BENCHMARKS["multi30k"].flags(str(tmp_path))
    multi30k.main([*flags, "--probe", "--run-dir", str(tmp_path / "run")])
    output = capsys.readouterr().out
    record = json.loads([line for line in output.splitlines() if line.startswith("{")][0])
    assert record["benchmark"] == "multi30k_probe" and "dev_bleu" in record and "bleu" not in record
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "dev_bleu" in metrics and "bleu" not in metrics and "sentences" not in metrics
    assert not (tmp_path / "run" / "translations.test.txt").exists()
    assert [row["checkpoint"] for row in metrics["dev_tried"]] == ["averaged", "last"]  # no decoding grid


def test_multi30k_names_the_missing_files_and_takes_the_repositorys_test_name(tmp_path):
    for name in ("train.en", "train.de", "val.en", "test_2016_flickr.en", "test_2016_flickr.de"):
        (tmp_path / name).write_text("A dog.\n", encoding="utf-8")
    expected = f"--data {tmp_path} lacks val.de (Multi30k's file names; the test split may be test2016 or test_2016_flickr)"
    with pytest.raises(SystemExit, match=re.escape(expected)):
        multi30k.test_split(str(tmp_path))
    (tmp_path / "val.de").write_text("Ein Hund.\n", encoding="utf-8")
    assert multi30k.test_split(str(tmp_path)) == "test_2016_flickr"
    (tmp_path / "train.de").unlink()
    with pytest.raises(SystemExit, match="lacks train.de"):
        multi30k.test_split(str(tmp_path))


def test_without_the_suites_exports_a_smoke_mode_exports_the_run_once_per_beam_size(tmp_path, monkeypatch):
    from export import saved_model

    made = []

    def exported(run_dir, base, settings, version):
        made.append((run_dir, settings.beam_size, version))
        os.makedirs(os.path.join(base, str(version)))
        return os.path.join(base, str(version))

    monkeypatch.setattr(saved_model, "export", exported)
    monkeypatch.setattr(smoke, "run", lambda scratch: "the run")
    for variable in (smoke.EXPORT_VARIABLE, smoke.GREEDY_EXPORT_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    beam = smoke.export(str(tmp_path))
    assert smoke.export(str(tmp_path)) == beam != smoke.export(str(tmp_path), beam_size=1)  # compare_exports asks twice
    assert made == [("the run", 4, 4), ("the run", 1, 1)]


def test_the_smoke_runner_names_an_unknown_benchmark_and_the_known_ones(capsys):
    from bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["--smoke", "bench.decode", "bench.nonesuch"])
    error = capsys.readouterr().err
    assert "no benchmark bench.nonesuch (there are compare_exports, corpus_scale," in error


def test_the_main_job_benchmark_checks_the_readmes_sentences_and_translations():
    from bench import demo

    with open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    (command,) = [line for line in readme.splitlines() if line.startswith("python -m export.translate exports/demo ")]
    assert command.split(" ", 4)[4] == " ".join(f'"{sentence}"' for sentence in demo.SENTENCES)
    assert "\n".join(demo.SENTENCES.values()) in readme  # the translations the README shows, in order
