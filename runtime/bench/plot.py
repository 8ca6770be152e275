"""`seq2serve bench plot`: throughput against batch size / concurrency from bench JSON files
(seq2serve's points and each HF baseline's, one line per file)."""

from __future__ import annotations


def add_plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="plot bench offline JSON results (needs matplotlib)")
    p.add_argument("results", nargs="+", help="JSON files written by bench offline --json")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument("--title", default="Output tokens/s")
    p.set_defaults(fn=_plot, json=None)


def _plot(args) -> dict:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    hf_style = {"default": ("x", "tab:red"), "static": ("D", "tab:purple")}
    for path in args.results:
        with open(path) as f:
            res = json.load(f)
        shape = res["workload"].get("shape") or res["workload"].get("model_path")
        pts = sorted((r["concurrency"], r["tokens_per_s"]) for r in res["seq2serve"]
                     if "tokens_per_s" in r)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"seq2serve {shape}")
        for h in res.get("hf", []):
            if "tokens_per_s" in h:
                marker, color = hf_style.get(h["mode"], ("s", "tab:gray"))
                ax.scatter([h["batch_size"]], [h["tokens_per_s"]], marker=marker, color=color,
                           label=f"HF generate ({h['mode']}) {shape}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency / batch size")
    ax.set_ylabel("output tokens/s")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return {}
