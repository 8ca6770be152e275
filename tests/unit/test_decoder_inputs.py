"""DecoderInputs: the one description of a decoder forward's inputs. Upload and the recast of
a short EXTEND as decode rows handle every field from its declaration alone (per token or per
request, dtype), so a new field needs no code in either."""

from __future__ import annotations

import torch

from seq2serve.runtime.attention.forward_batch import (
    DecoderInputs,
    ForwardMode,
    input_fields,
    optional_fields,
)
from seq2serve.runtime.executor.worker_batch import DecoderBatch, decode_rows


def _extend(ranged: bool) -> DecoderBatch:
    """Two requests: 3 new tokens at positions 4..6 of row 7, 2 at positions 0..1 of row 2."""
    x = DecoderInputs(
        input_ids=torch.tensor([11, 12, 13, 21, 22]),
        positions=torch.tensor([4, 5, 6, 0, 1]),
        out_cache_loc=torch.tensor([40, 41, 42, 50, 51]),
        cross_kv_start=torch.tensor([0, 0, 3, 0, 0], dtype=torch.int32) if ranged else None,
        cross_kv_end=torch.tensor([3, 3, 9, 0, 5], dtype=torch.int32) if ranged else None,
        req_pool_indices=[7, 2], seq_lens=[7, 2], extend_lens=[3, 2], encoder_lens=[9, 5],
        cross_group_lens=[1, 1])
    return DecoderBatch(ForwardMode.EXTEND, x)


def test_upload_gives_every_field_with_its_declared_dtype():
    x = _extend(ranged=True).inputs
    dev = x.upload("cpu")
    assert set(dev) == {f.name for f in input_fields()}
    for f in input_fields():
        assert dev[f.name].dtype == f.metadata["dtype"], f.name
        assert dev[f.name].tolist() == torch.as_tensor(getattr(x, f.name)).tolist(), f.name
    plain = _extend(ranged=False).inputs.upload("cpu")
    assert all(plain[f.name] is None for f in optional_fields())


def test_present_names_the_optional_fields_a_batch_sets():
    assert _extend(ranged=True).inputs.present() == {"cross_kv_start", "cross_kv_end"}
    assert _extend(ranged=False).inputs.present() == frozenset()


def test_decode_rows_repeats_request_fields_and_keeps_token_fields():
    b = _extend(ranged=True)
    rows, last = decode_rows(b)
    assert rows.forward_mode is ForwardMode.DECODE and rows.batch_size == 5
    assert last.tolist() == [2, 4]  # each request's last token
    for f in input_fields():
        got = getattr(rows.inputs, f.name)
        got = got.tolist() if isinstance(got, torch.Tensor) else got
        if f.name == "seq_lens":  # a row at position p reads keys [0, p]
            assert got == [5, 6, 7, 1, 2]
        elif f.name == "extend_lens":
            assert got == [1] * 5
        elif f.metadata["per"] == "request":
            want = {"req_pool_indices": [7, 7, 7, 2, 2], "encoder_lens": [9, 9, 9, 5, 5],
                    "cross_group_lens": [1] * 5}  # (an EXTEND's rows: no beam groups)
            assert got == want[f.name], f.name
        else:  # per token: already one value per row
            assert got == getattr(b.inputs, f.name).tolist(), f.name
    assert rows.inputs.present() == b.inputs.present()
