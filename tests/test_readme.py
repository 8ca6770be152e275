"""The README's example commands, run as written: the Quickstart's `make serve` (its `make test`
is what CI runs), every `bash` and `python` block in order, with what a reader would check in
their output. Only three things are rewritten: `.venv/bin/` is this interpreter's bin
directory, ports 30000/30001 are free ports, and /tmp/ is a fresh directory. `text` blocks are
synopses (placeholders such as DIR), not commands."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

# what a reader checks in the output: (a piece of the command, a piece of its output)
EXPECTED = [
    ('"input": ["1984", "-42"]', "one thousand nine hundred eighty-four"),
    ('"input": ["1984", "-42"]', "negative forty-two"),
    ("90210", "ninety thousand two hundred ten"),
    ('engine.translate("1984"', "one thousand nine hundred eighty-four"),
    ("demo_translation_path", "Heute baut das Team 3 rote Brücken. Sieht Anna das Schiff im "
                              "alten Garten?"),
    ("demo_translation_path", "- `make bridges` **Die Arbeiter brauchen 12 schwere Steine!**"),
    ("capital of France", "Paris"),
    ("convert-gguf", "134.5M parameters"),
    ("translate digits to English: 2024", "two thousand twenty-four"),
    ("translate digits to English: 7", '"text":"seven"'),
    ('"31337"', "data: [DONE]"),
    ("metrics", "seq2serve_requests_total"),
    ("OpenAI(", "one thousand nine hundred eighty-four\nforty-two\n"),
    ("write_mllama_checkpoint", "["),
    ('"beam_size": 4', "two thousand twenty-four"),
    ('"alternatives": 3', '"translation":"one thousand nine hundred eighty-eight","score":-0.5'),
    ('"format": "markdown"', "- [ninety thousand two hundred ten](https://example.com/7)"),
    ('"format": "markdown"', "# one thousand nine hundred eighty-four\\n\\n- forty-two `x = 7`"),
    ("num_return_sequences", "one thousand nine hundred eighty-four"),
    ("engine.check_integrity()", "{'idle': True}"),
    ("def number_words", "one thousand nine hundred eighty-four [-0.04, -7.21"),
    ("def number_words", "['one thousand nine hundred forty-eight', 'one thousand nine hundred "
                         "eighty-four']"),
    ("def three_languages", "['"),
    ("def to_german", "|"),
    ("def image_chat", "['user', 'assistant', 'user', 'assistant']"),
    ('"logprob_start_len": 1', '"input_token_logprobs":[[-'),
    ("bench offline", "ratio seq2serve / HF default"),
    ("bench plot", "wrote"),
    ("bench serving", "\"failed\": 0"),
]


def readme_blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(README.read_text())]


def _commands(block: str) -> list[str]:
    """A bash block's commands: backslash continuations joined, blank lines dropped."""
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_block_is_a_command_or_a_marked_synopsis():
    blocks = readme_blocks()
    assert {lang for lang, _ in blocks} <= {"bash", "python", "text"}, blocks
    synopses = [text for lang, text in blocks if lang == "text"]
    assert len(synopses) == 1 and "DIR" in synopses[0], synopses
    quickstart = _commands(blocks[0][1])
    assert [c.split("#")[0].strip() for c in quickstart] == ["make serve", "make test"]


def test_ci_runs_the_quickstart_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M), ci


def test_every_flag_is_documented():
    import dataclasses

    from seq2serve.runtime.config.server_args import ServerArgs

    text = README.read_text()
    helps = ServerArgs.field_help()
    for f in dataclasses.fields(ServerArgs):
        if f.name != "extra":
            flag = "--" + f.name.replace("_", "-")
            assert f"| `{flag}` |" in text and helps[f.name] in text, flag


class _Servers:
    def __init__(self):
        self.procs: list[tuple[subprocess.Popen, bool]] = []

    def start(self, argv: list[str], port: int, log: Path, *, direct: bool) -> None:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((proc, direct))
        deadline = time.monotonic() + 600  # `make serve` may set up the environment first
        while True:
            assert proc.poll() is None, f"{argv} exited {proc.returncode}:\n{log.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{argv}: no /health\n{log.read_text()}"
            time.sleep(0.5)

    def stop(self) -> list[int]:
        codes = []
        for proc, direct in self.procs:
            if proc.poll() is None and direct:
                proc.terminate()
            elif proc.poll() is None:
                # `make serve`: make and the server share a session; the server is the one
                # that must stop cleanly (make itself dies of the signal)
                os.killpg(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=60)
            if direct:
                codes.append(code)
        return codes


def test_readme_examples_run(tmp_path):
    ports = {"30000": str(_free_port()), "30001": str(_free_port())}
    work = tmp_path / "tmp"
    work.mkdir()

    def rewrite(text: str) -> str:
        # /tmp/ first: this interpreter may itself live under /tmp (CI's cached venv)
        text = text.replace("/tmp/", f"{work}/").replace(".venv/bin/", f"{BIN}/")
        return re.sub(r"\b3000[01]\b", lambda m: ports[m.group(0)], text)

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    servers = _Servers()
    ran: list[tuple[str, str]] = []
    try:
        for lang, block in readme_blocks():
            if lang == "text":
                continue
            if lang == "python":
                r = subprocess.run([sys.executable, "-c", rewrite(block)], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=900)
                assert r.returncode == 0, f"{block}\n---\n{r.stdout}{r.stderr}"
                ran.append((block, r.stdout))
                continue
            for command in _commands(block):
                if command.startswith("make test"):
                    continue  # CI's command: test_ci_runs_the_quickstart_test_command
                if command.startswith("make serve"):
                    servers.start(["make", "serve", f"VENV={sys.prefix}",
                                   f"ARGS=--device cpu --port {ports['30000']}"],
                                  int(ports["30000"]), tmp_path / "make-serve.log", direct=False)
                    ran.append((command, ""))
                    continue
                if " serve " in command and "bench" not in command:
                    port = int(re.search(r"--port (\d+)", rewrite(command)).group(1))
                    servers.start(["bash", "-c", rewrite(command)], port,
                                  tmp_path / f"serve-{port}.log", direct=True)
                    ran.append((command, ""))
                    continue
                r = subprocess.run(["bash", "-o", "pipefail", "-c", rewrite(command)], cwd=work,
                                   env=env, capture_output=True, text=True, timeout=900)
                assert r.returncode == 0, f"{command}\n---\n{r.stdout}{r.stderr}"
                ran.append((command, r.stdout + r.stderr))
    finally:
        codes = servers.stop()
    assert codes and all(c == 0 for c in codes), codes

    for needle, expected in EXPECTED:
        outputs = [out for command, out in ran if needle in command]
        assert outputs, f"no README example contains {needle!r}"
        assert any(expected in out for out in outputs), \
            f"{needle!r}: expected {expected!r} in\n{outputs}"
