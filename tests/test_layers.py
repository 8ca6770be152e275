"""The package's layering rule, as `import-linter` contracts in pyproject.toml: every package
imports only the packages below it (lang > cli > bench > frontend > scheduler > messages > encoders >
executor > config/tools > models > attention > cross_attention > memory > kernels), and no
package's modules or subpackages import each other in a cycle."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _lint(config: pathlib.Path) -> subprocess.CompletedProcess:
    """`lint-imports` (its console script may belong to another checkout's venv: CI links one)"""
    code = ("import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv[0] = 'lint-imports'; lint_imports_command()")
    return subprocess.run([sys.executable, "-c", code, "--config", str(config), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_packages_import_downward_only_and_without_cycles():
    r = _lint(ROOT / "pyproject.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout, r.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check can fail: a contract claiming that the kernels sit above the attention
    backends is broken by the backends' imports of the kernels, and the report names them."""
    config = tmp_path / "pyproject.toml"
    config.write_text('''[tool.importlinter]
root_package = "seq2serve"

[[tool.importlinter.contracts]]
name = "kernels above attention (wrong on purpose)"
type = "layers"
layers = ["seq2serve.runtime.kernels", "seq2serve.runtime.attention"]
''')
    r = _lint(config)
    assert r.returncode == 1 and "0 kept, 1 broken" in r.stdout, r.stdout
    assert "seq2serve.runtime.attention.base -> seq2serve.runtime.kernels.position_bias" in r.stdout


def test_modules_md_lists_every_module_of_the_package():
    """docs/modules.md cannot go stale: its package sections name exactly the package's modules."""
    import re

    listed, section = set(), None
    for line in (ROOT / "docs" / "modules.md").read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif section and (m := re.match(r"- `([^`]+\.py)`", line)):
            listed.add(section + m.group(1))
    package_dirs = ("lang", "runtime", "encoders", "cross_attention", "models")
    actual = {str(p.relative_to(ROOT)) for d in package_dirs for p in (ROOT / d).rglob("*.py")
              if p.name != "__init__.py" and "__pycache__" not in p.parts}
    listed = {p for p in listed if p.startswith(package_dirs)}
    assert not actual - listed, f"modules missing from docs/modules.md: {sorted(actual - listed)}"
    assert not listed - actual, f"docs/modules.md lists modules that do not exist: " \
                                f"{sorted(listed - actual)}"
