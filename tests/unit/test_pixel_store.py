"""PixelStore: the one way image pixels travel to the scheduler. Files are written once per
image, kept while a request uses them, then kept up to a budget (LRU); a request whose file
is gone gets an error, never a crash or a leaked slot."""

from __future__ import annotations

import os

import torch

from seq2serve.encoders.encoder_input import ImageFeatures
from seq2serve.encoders.pixel_store import _PREFIX, PixelStore
from seq2serve.tests.helpers import request
from seq2serve.tests.unit.test_scheduler_policy import scheduler


def _image(key: str, value: float = 1.0) -> ImageFeatures:
    px = torch.full((2, 3, 4, 4), value, dtype=torch.bfloat16)
    return ImageFeatures(pixel_values=px, aspect_ratio_id=1, num_tiles=2, num_tokens=6, key=key)


def test_pixels_round_trip_and_a_file_is_written_once(tmp_path):
    store = PixelStore(root=str(tmp_path))
    img = _image("a", 0.5)
    first = img.stored(store.put("a", img.pixel_values))
    second = img.stored(store.put("a", img.pixel_values))
    assert first.pixel_values is None and first.has_data and store.num_files == 1
    assert torch.equal(first.pixels(), img.pixel_values) and torch.equal(second.pixels(),
                                                                          img.pixel_values)
    store.close()
    assert not os.path.exists(store.root) and not first.has_data


def test_pinned_files_stay_and_unpinned_ones_go_over_the_budget(tmp_path):
    size = _image("x").pixel_values.numel() * 2
    store = PixelStore(budget_bytes=2 * size, root=str(tmp_path))
    for k in "abc":
        store.put(k, _image(k).pixel_values)
    assert store.num_files == 3  # all pinned: nothing may go
    for k in "abc":
        store.release(k)
    assert store.num_files == 2 and not os.path.exists(store.path("a"))  # oldest first
    store.put("b", _image("b").pixel_values)  # a repeat pins it again: "c" is next out
    for k in "de":
        store.put(k, _image(k).pixel_values)
        store.release(k)
    assert os.path.exists(store.path("b")) and not os.path.exists(store.path("c"))
    assert store.num_files == 3  # b (pinned), d and e


def test_a_killed_process_folder_is_removed_by_the_next_store(tmp_path):
    orphan = tmp_path / f"{_PREFIX}999999999-abc"  # no such process
    orphan.mkdir()
    (orphan / "k").write_bytes(b"x" * 10)
    mine = tmp_path / f"{_PREFIX}{os.getpid()}-live"
    mine.mkdir()
    PixelStore(root=str(tmp_path)).close()
    assert not orphan.exists() and mine.exists()


def test_a_request_whose_pixels_are_gone_fails_alone(tmp_path):
    sched = scheduler()
    store = PixelStore(root=str(tmp_path))
    img = _image("gone")
    tr = request("lost", [5, 6, 7], max_new_tokens=4)
    tr.encoder_inputs = [img.stored(store.put("gone", img.pixel_values))]
    store.close()  # the sender released it
    sched.add_request(tr)
    sched.add_request(request("fine", [8, 9], max_new_tokens=3))
    outs = []
    while sched.has_work:
        outs += sched.step()
    errors = [o for o in outs if o.error]
    assert [o.rid for o in errors] == ["lost"] and "no longer available" in errors[0].error
    assert sum(len(o.new_token_ids) for o in outs if o.rid == "fine") == 3
    sched.check_integrity()


def test_a_batch_reads_each_file_into_its_slot_and_refuses_a_file_of_another_size(tmp_path):
    from seq2serve.encoders.encoder_input import stacked_pixels

    store = PixelStore(root=str(tmp_path))
    images = [_image(k, v) for k, v in (("a", 0.5), ("b", -2.0), ("c", 3.0))]
    # the first two travel as files, the third in the request itself
    batch = [img.stored(store.put(img.key, img.pixel_values)) for img in images[:2]]
    batch.append(images[2])
    stacked = stacked_pixels(batch)
    assert not stacked.is_pinned()  # (pinned only for a GPU encoder: `pin`)
    assert torch.equal(stacked, torch.stack([img.pixel_values for img in images]))
    with open(store.path("a"), "ab") as f:  # one byte too many
        f.write(b"\0")
    try:
        stacked_pixels(batch)
        raise AssertionError("a file of another size was read")
    except ValueError as e:
        assert store.path("a") in str(e)
    other = ImageFeatures(pixel_values=torch.zeros(1, 3, 4, 4, dtype=torch.bfloat16),
                          aspect_ratio_id=1, num_tiles=1, num_tokens=3, key="d")
    try:
        stacked_pixels([images[2], other])
        raise AssertionError("images of two sizes were stacked")
    except ValueError as e:
        assert "image 1" in str(e)
    os.unlink(store.path("b"))
    try:
        stacked_pixels(batch[1:])
        raise AssertionError("a deleted file was read")
    except FileNotFoundError:
        pass
    store.close()


def test_a_file_of_samples_is_read_whole_by_its_size(tmp_path):
    """An audio window travels as float32 samples of no fixed count (`read_pixels`' -1)."""
    from seq2serve.encoders.pixel_store import read_pixels

    store = PixelStore(root=str(tmp_path))
    samples = torch.linspace(-1, 1, 37)
    assert torch.equal(read_pixels(store.put("w", samples), torch.float32, (-1,)), samples)
    store.close()
