"""Training across hosts under JAX: the product's step (`training.backends.jax`) on one global
batch, as two processes of two host devices each joined on 127.0.0.1 (JAX's multi-controller
runtime, gloo collectives) and as one process of four host devices, in target tokens per second
per device, the two setups alternating in one run.

    python -m bench.multihost                 # small config, 256 pairs of 32 + 32 tokens
    python -m bench.multihost --batch 64 --steps 20   # a quarter of it: the per-step cost weighs more

Each process feeds its own rows of the global batch (`jax.make_array_from_process_local_data`),
as `training.train --processes N` does. All devices share this machine's cores, so the figure
is what the runtime and the collectives between processes cost, not what more hosts would add.
"""

import argparse
import os
import subprocess
import sys
import time

from bench.common import emit, held_port, with_xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    """One process: the step on its rows of the global batch; process 0 prints tokens/s."""
    from training.backends import jax as jax_backend

    if args.processes > 1:
        jax_backend.initialize_processes(args.coordinator, args.processes, args.process_id)
    import keras
    import numpy as np
    import tensorflow as tf

    from bench.train_throughput import make_config
    from training.schedule import TransformerSchedule, paper_optimizer

    keras.utils.set_random_seed(0)
    config = make_config(args.config, args.vocab_size)
    backend = jax_backend.JaxBackend("cpu")
    backend.build(config, lambda: paper_optimizer(TransformerSchedule(config.d_model)))
    backend.compile(label_smoothing=0.1)
    rng = np.random.default_rng(0)  # the same global batch in every process, which takes its rows
    ids = rng.integers(4, args.vocab_size, size=(3, args.batch, args.length), dtype=np.int32)
    rows = slice(backend.process_index * args.batch // args.processes, (backend.process_index + 1) * args.batch // args.processes)
    batch = {"source": ids[0, rows], "target_input": ids[1, rows], "target_output": ids[2, rows],
             "dropped_pairs": np.zeros([args.batch // args.processes], np.int64)}  # fmt: skip
    batches = iter(tf.data.Dataset.from_tensors(batch).repeat())  # as training reads batches
    backend.train_steps(batches, 2)  # compile and warm up
    start = time.perf_counter()
    _, tokens, _ = backend.train_steps(batches, args.steps)
    seconds = time.perf_counter() - start
    if backend.is_chief:
        print(f"RESULT {tokens / seconds / backend.num_replicas} {backend.num_replicas}", flush=True)


def run(args, processes, devices_each):
    """Tokens/s per device of `processes` processes of `devices_each` host devices."""
    env = with_xla_flags({**os.environ, "KERAS_BACKEND": "jax"}, f"--xla_force_host_platform_device_count={devices_each}")
    with held_port() as port:  # held until the processes end: the coordinator binds it beside us
        flags = ["--config", args.config, "--vocab-size", str(args.vocab_size), "--batch", str(args.batch), "--length",
                 str(args.length), "--steps", str(args.steps), "--processes", str(processes), "--coordinator",
                 f"127.0.0.1:{port}"]  # fmt: skip
        commands = [["timeout", "1800", sys.executable, "-m", "bench.multihost", "--worker", "--process-id", str(i), *flags]
                    for i in range(processes)]  # fmt: skip
        started = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for c in commands]  # fmt: skip
        outputs = [process.communicate() for process in started]
    for process, (_, stderr) in zip(started, outputs):
        if process.returncode:
            raise SystemExit(f"a process of the {processes}-process run failed:\n{stderr[-3000:]}")
    line = next(line for line in outputs[0][0].splitlines() if line.startswith("RESULT "))
    return float(line.split()[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="small")
    parser.add_argument("--vocab-size", type=int, default=8000)
    # 256 x 32 target tokens: 2,048 a device, near the paper's 25,000 over 8 GPUs (about 3,100 each).
    parser.add_argument("--batch", type=int, default=256, help="rows of the global batch")
    parser.add_argument("--length", type=int, default=32, help="source and target tokens per row")
    parser.add_argument("--steps", type=int, default=6, help="steps timed, after 2 of warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="times each setup runs, alternating")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    for round_ in range(args.rounds):
        one = run(args, 1, 4)
        two = run(args, 2, 2)
        emit({"benchmark": "multihost", "round": round_, "config": args.config, "global_batch": [args.batch, args.length],
              "one_process_4_devices_tgt_tokens_per_s_per_device": round(one, 1),
              "two_processes_2_devices_tgt_tokens_per_s_per_device": round(two, 1), "ratio": round(two / one, 3)})  # fmt: skip


if __name__ == "__main__":
    main()
