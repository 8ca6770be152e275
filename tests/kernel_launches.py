"""Every Triton kernel launch the runtime makes, compiled for real GPU targets on a machine
without a GPU.

The CPU suite runs kernels in Triton's interpreter, which executes only the branches a launch
takes and accepts a bf16 pointer wherever an atomic gets one; the GPU compiler compiles every
branch of every launch. `record_launches()` notes each launch the interpreter runs (the
kernel, its argument types and alignment, its constexprs and launch options);
`compile_launches()` compiles them with Triton's own argument specialization for each target,
in a fresh process without TRITON_INTERPRET (ptxas ships in Triton's wheel), and returns each
launch's compiler errors. Run as a module it is that process:

    python -m seq2serve.tests.kernel_launches launches.json results.json
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TARGETS = (90, 80)  # Hopper (H100/H200), Ampere (A100): compute capabilities compiled for
PACKAGE_DIR = Path(__file__).resolve().parent.parent
KERNEL_DIRS = ("runtime", "models", "encoders", "cross_attention")
_I32 = 2**31
SHARED_LIMIT = {90: 232448, 80: 166912}  # bytes of shared memory one block may opt into


# ---- recording (in the interpreter) ----

def _is_constexpr(param: inspect.Parameter) -> bool:
    ann = param.annotation
    return "constexpr" in (ann if isinstance(ann, str) else getattr(ann, "__name__", ""))


def _describe(value, constexpr: bool):
    """A JSON description of one argument, reduced to what Triton specializes on: a tensor's
    dtype and 16-byte alignment, whether an int is 1 or a multiple of 16 (and its width)."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."),
                "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, int):
        if constexpr or value == 1:
            return {"value": value}
        wide = not -_I32 <= value < _I32
        return {"value": (2**32 if wide else 16) + (0 if value % 16 == 0 else 1)}
    if isinstance(value, float):
        return {"value": value if constexpr else 0.5}
    raise TypeError(f"kernel argument of type {type(value).__name__} is not described")


@contextlib.contextmanager
def record_launches():
    """Within the block, every interpreted kernel launch is added (once per distinct
    description) to the list this yields."""
    from triton.runtime.interpreter import InterpretedFunction

    launches: list[dict] = []
    seen: set[str] = set()
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        params = inspect.signature(self.fn).parameters
        names = list(params)
        launch = {
            "kernel": f"{self.fn.__module__}:{self.fn.__name__}",
            "args": [_describe(a, _is_constexpr(params[n])) for n, a in zip(names, args)],
            "kwargs": {k: _describe(v, k not in params or _is_constexpr(params[k]))
                       for k, v in sorted(kwargs.items())},
        }
        key = json.dumps(launch, sort_keys=True)
        if key not in seen:
            seen.add(key)
            launches.append(launch)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording_run
    try:
        yield launches
    finally:
        InterpretedFunction.run = run


def compile_launches(launches: list[dict], timeout: float = 1200) -> dict:
    """Compiles every launch for every target in a fresh process (no interpreter). Returns
    {"results": [{"launch": i, "kernel", "target", "variant", "error"}], "kernels": {name:
    [names of the package's jit functions it calls]}, "compiled": n}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "launches.json"), Path(tmp, "results.json")
        src.write_text(json.dumps(launches))
        proc = subprocess.run([sys.executable, "-m", "seq2serve.tests.kernel_launches",
                               str(src), str(dst)], env=env, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the compile process failed:\n{proc.stderr[-4000:]}")
        return json.loads(dst.read_text())


# ---- compiling (a process without the interpreter) ----

def _kernel(name: str):
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


def _value(desc: dict):
    import torch

    if "tensor" in desc:
        dtype = getattr(torch, desc["tensor"])
        t = torch.empty(64, dtype=dtype)  # CPU allocations are 64-byte aligned
        return t if desc["aligned"] else t[1:]
    return desc["value"]


def _variants(kernel, launch: dict, cap: int):
    """(name, kwargs) for each way the runtime may launch this recorded call on `cap`. For
    bf16 (the GPU default) on Hopper, also every autotuner config of the kernel and the launch
    under programmatic dependent launch (SEQ2SERVE_PDL=1)."""
    from triton.runtime.autotuner import Autotuner

    kwargs = {k: _value(v) for k, v in launch["kwargs"].items()}
    variants = [("as recorded", kwargs)]
    if cap < 90 or not any(a.get("tensor") == "bfloat16" for a in launch["args"]):
        return variants
    if "PDL" in kernel.arg_names and _pdl_supported():
        variants.append(("PDL", {**kwargs, "PDL": True, "launch_pdl": True}))
    module = sys.modules[kernel.fn.__module__]
    for tuner in [v for v in vars(module).values()
                  if isinstance(v, Autotuner) and v.fn is kernel]:
        for cfg in tuner.configs:  # the tour gave block sizes; the runtime lets these choose
            variants.append((f"autotune {cfg.kwargs} warps={cfg.num_warps}",
                             {**kwargs, **cfg.kwargs, "num_warps": cfg.num_warps,
                              "num_stages": cfg.num_stages}))
    return variants


def _pdl_supported() -> bool:
    from triton.backends.nvidia.compiler import CUDAOptions

    return "launch_pdl" in CUDAOptions.__dataclass_fields__


def _bind(kernel, args: list, kwargs: dict, cap: int):
    """Triton's own specialization of this call for the target: (signature, constexprs,
    attrs, options) exactly as JITFunction.run would compile it on such a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", cap, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, opts, bound, spec, opts)
    return signature, constexprs, attrs, options


def _compile(job: tuple) -> str | None:
    """None, or the compiler's message (or why the GPU would refuse to launch it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, cap, signature, constexprs, attrs, options = job
    kernel = _kernel(name)
    try:
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                                  target=GPUTarget("cuda", cap, 32), options=options)
    except Exception as e:  # noqa: BLE001 -- the message is the result
        return f"{type(e).__name__}: {e}"
    if compiled.metadata.shared > SHARED_LIMIT[cap]:
        return (f"out of resource: {compiled.metadata.shared} bytes of shared memory, "
                f"sm_{cap} blocks get at most {SHARED_LIMIT[cap]}")
    return None


def _package_kernels() -> dict[str, object]:
    """Every jit function defined in the package's kernel folders, by 'module:name'."""
    from triton.runtime.jit import JITFunction

    found = {}
    for folder in KERNEL_DIRS:
        for path in sorted((PACKAGE_DIR / folder).rglob("*.py")):
            if "triton.jit" not in path.read_text():
                continue
            rel = path.relative_to(PACKAGE_DIR).with_suffix("")
            module = importlib.import_module("seq2serve." + ".".join(rel.parts))
            for attr, obj in vars(module).items():
                if isinstance(obj, JITFunction) and obj.fn.__module__ == module.__name__:
                    found[f"{module.__name__}:{attr}"] = obj
    return found


def _callees(kernels: dict[str, object]) -> dict[str, list[str]]:
    """kernel -> the package's jit functions its source calls by name."""
    return {name: sorted(other for other in kernels if other != name and re.search(
        rf"\b{re.escape(other.split(':')[1])}\s*\(", k.src)) for name, k in kernels.items()}


def main(src: str, dst: str) -> None:
    from concurrent.futures import ProcessPoolExecutor

    launches = json.loads(Path(src).read_text())
    jobs, owners, results = {}, {}, []
    for i, launch in enumerate(launches):
        kernel = _kernel(launch["kernel"])
        args = [_value(a) for a in launch["args"]]
        for cap in TARGETS:
            for variant, kwargs in _variants(kernel, launch, cap):
                try:
                    sig, consts, attrs, options = _bind(kernel, args, kwargs, cap)
                except Exception as e:  # noqa: BLE001 -- a call Triton would refuse
                    results.append(dict(launch=i, kernel=launch["kernel"], target=f"sm_{cap}",
                                        variant=variant, error=f"{type(e).__name__}: {e}"))
                    continue
                job = (launch["kernel"], cap, sig, consts, attrs, options.__dict__)
                key = repr(job)
                jobs.setdefault(key, job)
                owners.setdefault(key, []).append((i, f"sm_{cap}", variant))
    keys = list(jobs)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        errors = list(pool.map(_compile, [jobs[k] for k in keys], chunksize=1))
    for key, error in zip(keys, errors):
        for i, target, variant in owners[key]:
            results.append(dict(launch=i, kernel=launches[i]["kernel"], target=target,
                                variant=variant, error=error))
    kernels = _package_kernels()
    Path(dst).write_text(json.dumps({"results": results, "compiled": len(keys),
                                     "kernels": _callees(kernels)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
