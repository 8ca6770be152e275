"""`bench offline`'s arguments as a user types them: several HF batch sizes comma- or
space-separated (a space-separated list was refused as an unknown argument, after the
machine had started), and bad sizes refused by name."""

from __future__ import annotations

import argparse

import pytest

from seq2serve.runtime.bench.cli_bench import add_bench_parser


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="bench", required=True))
    return parser.parse_args(["offline", "--shape", "opus-mt", *argv])


@pytest.mark.parametrize("argv", [("128,256",), ("128", "256"), ("128,256", "512"),
                                  ("128", "256", "--num-beams", "3")])
def test_hf_batch_sizes_comma_or_space_separated(argv):
    want = [128, 256, 512] if "512" in argv else [128, 256]
    ns = _parse("--hf-batch-size", *argv)
    assert ns.hf_batch_size == want
    assert ns.num_beams == (3 if "--num-beams" in argv else 1)


def test_hf_batch_size_defaults_to_none_and_refuses_bad_sizes(capsys):
    assert _parse().hf_batch_size is None
    for bad in ("0", "128,x", "-4"):
        with pytest.raises(SystemExit):
            _parse("--hf-batch-size", bad)
        assert "batch sizes must be positive integers" in capsys.readouterr().err
