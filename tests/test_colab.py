"""The Colab notebook: valid, committed without outputs, and executed top to bottom in smoke mode."""

import ast
import os
import subprocess
import sys

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "colab", "train_on_tpu.ipynb")
# What requirements.txt installs, the standard library, and the project's own packages.
ALLOWED = {"keras", "jax", "tensorflow", "tensorflow_text", "tensorflow_datasets", "sentencepiece", "sacrebleu", "tensorboard",
           "matplotlib", "numpy", "keras_transformer", "training", "export"} | set(sys.stdlib_module_names)  # fmt: skip


def _code_cells():
    return [cell for cell in nbformat.read(NOTEBOOK, as_version=4).cells if cell.cell_type == "code"]


def test_the_notebook_is_valid_and_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    for cell in _code_cells():
        assert cell.outputs == [] and cell.execution_count is None


def test_the_notebook_imports_only_what_the_requirements_install():
    for cell in _code_cells():
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                if top == "google":  # Colab's own module: only inside a try that expects ImportError
                    guarded = [t for t in ast.walk(tree) if isinstance(t, ast.Try) and node in ast.walk(t)]
                    assert guarded and any(h.type.id == "ImportError" for h in guarded[0].handlers)
                else:
                    assert top in ALLOWED, f"the notebook imports {name}, which requirements.txt does not install"


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom_on_jax_in_smoke_mode(tmp_path):
    from nbclient import NotebookClient

    from bench.smoke import corpus

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # A corpus of 8 test sentences, not the built-in one's 1000, which an untrained model's searches take long over.
    dataset = corpus(str(tmp_path), names=("train", "dev", "test"))
    os.environ.update(KERAS_TRANSFORMER_SMOKE="1", KERAS_TRANSFORMER_DIR=ROOT, KERAS_TRANSFORMER_SMOKE_DATASET=dataset)
    try:
        NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        for name in ("KERAS_TRANSFORMER_SMOKE", "KERAS_TRANSFORMER_DIR", "KERAS_TRANSFORMER_SMOKE_DATASET"):
            del os.environ[name]
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    import jax

    assert f"Keeping the runtime's jax=={jax.__version__}, jaxlib==" in text
    assert " on jax; JAX " in text and "cpu device(s)" in text
    assert "Test BLEU " in text and "Attention plot saved to " in text
    images = [output for output in outputs if output.output_type == "display_data" and "image/png" in output.data]
    assert len(images) >= 2  # the curves and the attention heatmap
    plot = text.split("Attention plot saved to ")[1].split()[0]
    assert os.path.getsize(plot) > 1000
    served = [line for line in text.splitlines() if line.startswith("SavedModel: ")]
    assert len(served) == 2 and all(" -> " in line for line in served)
    run_dir = os.path.dirname(plot)
    from training.run_folder import RunFolder

    assert RunFolder(run_dir).settings()["backend"] == "jax"


def test_without_a_tpu_the_notebook_stops_and_says_why():
    """Outside smoke mode, the Connect cell refuses to train on a machine without a TPU."""
    cells = _code_cells()
    connect = next(cell.source for cell in cells if "training_devices(STRATEGY)" in cell.source)
    script = "import os\nos.environ['KERAS_BACKEND'] = 'jax'\nSMOKE = False\nALLOW_WITHOUT_TPU = False\n" + connect
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})  # fmt: skip
    assert result.returncode != 0
    assert "--strategy tpu: JAX sees no TPU, only 1 cpu device(s). On Colab, pick a TPU runtime" in result.stderr
