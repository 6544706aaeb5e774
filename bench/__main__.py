"""Every benchmark's smoke mode (bench/smoke.py's registry), in one process: a check that each still
runs, in about five minutes on 2 cores (here a measurement that needs no environment of its own
runs in this process, bench/common.py's ONE_PROCESS).

    python -m bench --smoke                          # all of them
    python -m bench --smoke bench.decode bench.real_serving
    python -m bench --smoke --runs DIR               # benchmarks that make a run folder keep it in DIR/NAME

Each benchmark's JSON lines follow a line `== bench.NAME`; its seconds go to standard error. The
process runs TensorFlow with the README's serving threads (`export.serving.use_serving_threads`),
set before any benchmark runs.
"""

import argparse
import importlib
import os
import sys
import tempfile
import time

from bench import common, smoke


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", required=True, help="the smoke modes (the only mode here)")
    parser.add_argument("benchmarks", nargs="*", metavar="bench.NAME", help="those to run (default: all)")
    parser.add_argument("--runs", help="a folder for the run folders that benchmarks make (default: temporary ones)")
    args = parser.parse_args(argv)
    names = [module.removeprefix("bench.") for module in args.benchmarks] or smoke.BENCHMARKS
    if unknown := [name for name in names if name not in smoke.BENCHMARKS]:
        parser.error(f"no benchmark bench.{unknown[0]} (there are {', '.join(smoke.BENCHMARKS)})")
    from export.serving import use_serving_threads

    use_serving_threads()
    common.ONE_PROCESS = True
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            benchmark = smoke.BENCHMARKS[name]
            kept = [f"--run-dir={os.path.join(args.runs or scratch, name)}"] if benchmark.run_folder else []
            print(f"== bench.{name}", flush=True)
            start = time.monotonic()
            for flags in benchmark.flags(scratch):
                importlib.import_module(f"bench.{name}").main([*flags, *kept])
            print(f"bench.{name}'s smoke mode took {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
