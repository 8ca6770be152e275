"""The walkthrough notebooks in notebooks/ run top to bottom in a fresh kernel on this Python
(the one with seq2serve installed) and print what their text promises."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 300
KERNEL_NAME = "seq2serve-tests"

# a few cheap checks of what each notebook printed (beyond running without an error)
EXPECTED = {
    "01_quickstart.ipynb": ["one thousand nine hundred eighty-four\nforty-two\n",
                            "same seed, same samples: True", "ValueError: ", "; wrong: []",
                            "'stop'", "integrity: {", "RuntimeError: ", "ninety thousand two"],
    "02_translation_server.ipynb": ["0 one thousand nine hundred eighty-four (stop)",
                                    "3 one hundred thousand (stop)", "400 {'error'",
                                    "two thousand twenty-four", "thirty-one thousand",
                                    "seq2serve_requests_total{", "exit code: 0"],
    "03_image_chat.ipynb": ["different images, different answers: True",
                            "every form gives the same answer: True", "not an image: ValueError",
                            "count mismatch: ValueError", "too many pixels: ValueError",
                            "integrity: {", "12 tokens generated"],
    "04_caches.ipynb": ["encoder passes: 1 then 0", "encoder_cache_hit: [False, True, False, True]",
                        "encoder_cache_hit=True, cached_tokens=4",
                        "user=bob    'hundred fifty-six'", "encoder_cache_entries': 0",
                        "encoder cache hit rate"],
    "05_programs.ipynb": ["select picks: one thousand nine hundred eighty-four",
                          "same score as the scoring request: True", "1984 -> one thousand nine",
                          "streamed == generated: True", "same over HTTP: True",
                          "server exit code: 0", "3 translations:",
                          "the French branch is the plain request's text: True",
                          "same as engine.chat: True", "integrity: {"],
}


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture
def kernel_name(tmp_path, monkeypatch) -> str:
    """A kernelspec for this very interpreter, found first on JUPYTER_PATH, so the notebooks
    never run on some other Python that a machine-wide "python3" kernelspec points at."""
    spec = tmp_path / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"seq2serve tests ({sys.executable})", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("JUPYTER_PATH")) if p))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # silences jupyter_core's migration warning
    return KERNEL_NAME


def _printed(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        streamed = []  # one print may arrive in several stream messages: join them as is
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                streamed.append(out.text)
            elif "text/plain" in out.get("data", {}):
                parts.append(out.data["text/plain"])
        parts.append("".join(streamed))
    return "\n".join(parts)


def test_every_notebook_is_checked():
    assert [p.name for p in _notebooks()] == sorted(EXPECTED)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_saved_without_outputs(path):
    """CI executes them; committed outputs would only be stale blobs."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.stem, marks=() if p.name == "01_quickstart.ipynb" else pytest.mark.long)
    for p in _notebooks()])  # (the others run a minute or so each: SEQ2SERVE_LONG_TESTS=1)
def test_notebook_runs(path, kernel_name):
    nb = nbformat.read(path, as_version=4)
    # a failing cell raises CellExecutionError with the cell's traceback
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=kernel_name,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = _printed(nb)
    missing = [s for s in EXPECTED.get(path.name, []) if s not in printed]
    assert not missing, f"{path.name} did not print {missing}; it printed:\n{printed}"
    if path.name == "04_caches.ipynb":
        assert any("image/png" in out.get("data", {}) for cell in nb.cells
                   for out in cell.get("outputs", [])), "no plot"
