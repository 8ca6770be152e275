"""Mllama: parity with HF on a mixed batch, image inputs in every form, chat, and bad input."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint
from seq2serve.tests.mllama_oracle import MllamaOracle, random_image, reference_row_masking

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
IMAGE = 128256


@pytest.fixture(scope="module")
def mllama_dir(tmp_path_factory):
    return str(write_mllama_checkpoint(tmp_path_factory.mktemp("mllama"), seed=3))


@pytest.fixture(scope="module")
def oracle(mllama_dir):
    return MllamaOracle(mllama_dir)


@pytest.fixture(scope="module")
def engine(mllama_dir):
    with Seq2SeqEngine(model_path=mllama_dir, device="cpu", max_images_per_request=3,
                       max_image_pixels=200_000) as e:
        yield e
        e.check_integrity()


@pytest.fixture(scope="module")
def images():
    # wide (several tiles), tall, and square: different aspect ratios and tile counts
    return [random_image(1, 40, 90), random_image(2, 100, 30), random_image(3, 28, 28)]


def test_image_first_batch_matches_vanilla_hf(engine, oracle, images):
    """No token precedes its image here, so HF needs no fix: exact parity with HF as is."""
    tok = oracle.processor.tokenizer
    text = tok("Describe the picture", add_special_tokens=False).input_ids
    bos = tok.bos_token_id
    cases = [([IMAGE, bos] + text, [images[0]]),
             ([IMAGE, IMAGE, bos] + text, [images[0], images[1]]),
             ([bos] + text, []),
             ([IMAGE, bos] + text[:2] + [IMAGE] + text[2:], [images[1], images[2]])]
    outs = engine.generate(input_ids=[c[0] for c in cases], image_data=[c[1] for c in cases],
                           sampling_params=GREEDY)
    for (ids, imgs), out in zip(cases, outs):
        assert out["output_ids"] == oracle.generate_ids(ids, imgs, 8), ids
    tile_counts = {oracle.processor.image_processor(images=[[i]])["num_tiles"][0][0]
                   for i in images}
    assert len(tile_counts) > 1  # the batch really mixed tile counts


def test_mixed_batch_matches_hf_with_reference_masking(engine, oracle, images):
    """Raw prompts through HF's processor, including text before its image: HF with the
    upstream fix for its cross-attention leak (transformers#39379)."""
    cases = [("<|image|>What is shown here?", [images[0]]),
             ("<|image|><|image|>Compare these two", [images[0], images[1]]),
             ("Tell me a story about a cat", []),
             ("Look at this photo: <|image|> what is in it?", [images[2]])]
    outs = engine.generate(prompt=[c[0] for c in cases], image_data=[c[1] for c in cases],
                           sampling_params=GREEDY)
    with reference_row_masking():
        refs = [oracle.generate_text(p, imgs, 8) for p, imgs in cases]
    assert [o["output_ids"] for o in outs] == refs
    # and the images matter: without them the same prompt continues differently
    blind = engine.generate(prompt="What is shown here?", sampling_params=GREEDY)
    assert blind["output_ids"] != outs[0]["output_ids"]


def test_every_image_input_form_gives_the_same_answer(engine, images, tmp_path):
    buf = io.BytesIO()
    images[0].save(buf, format="PNG")
    raw = buf.getvalue()
    b64 = base64.b64encode(raw).decode()
    path = tmp_path / "img.png"
    path.write_bytes(raw)
    forms = [images[0], raw, b64, f"data:image/png;base64,{b64}", str(path)]
    outs = [engine.generate(prompt="<|image|>Describe", image_data=[f],
                            sampling_params=GREEDY)["output_ids"] for f in forms]
    assert all(o == outs[0] for o in outs)


def test_chat_with_image_parts(engine, oracle, images):
    messages = [{"role": "user", "content": [{"type": "image", "image": images[1]},
                                             {"type": "text", "text": "What is this?"}]}]
    out = engine.chat(messages, sampling_params=GREEDY)
    text = oracle.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"},
                                      {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True)
    with reference_row_masking():  # the chat header precedes the image
        # as HF's Llama 3.2 Vision example: the template already wrote the BOS token
        ref = oracle.generate_text(text, [images[1]], 8, add_special_tokens=False)
    assert out["output_ids"] == ref


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("image, message", [
    (b"not an image at all", "could not be decoded"),
    ("bm90IGFuIGltYWdl", "could not be decoded"),  # valid base64, not an image
    ("data:text/plain;base64,aGk=", "data URL"),
    ("%%% not base64 %%%", "base64"),
    ("ftp://example.com/x.png", "scheme"),
    ("https://example.com/x.png", "disabled"),
])
def test_bad_images_are_refused(engine, images, image, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt="<|image|>Describe", image_data=[image], sampling_params=GREEDY)
    assert engine.generate(prompt="<|image|>Hi", image_data=[images[2]],
                           sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 8


def test_truncated_oversized_and_miscounted_images(engine, images):
    png = _png(images[0])
    with pytest.raises(ValueError, match="could not be decoded"):
        engine.generate(prompt="<|image|>x", image_data=[png[: len(png) // 2]])
    with pytest.raises(ValueError, match="over the limit"):
        engine.generate(prompt="<|image|>x", image_data=[random_image(4, 500, 500)])
    with pytest.raises(ValueError, match="over the limit of 3"):
        engine.generate(prompt="<|image|>" * 4 + "x", image_data=[images[2]] * 4)
    with pytest.raises(ValueError, match="2 <|image|> token"):
        engine.generate(prompt="<|image|><|image|>x", image_data=[images[2]])
    with pytest.raises(ValueError, match="0 <|image|> token"):
        engine.generate(prompt="no image token", image_data=[images[2]])
    engine.check_integrity()


def test_openai_client_sends_an_image_data_url(mllama_dir, engine, images, tmp_path):
    import httpx
    import openai

    from seq2serve.tests.server_helpers import ServerProcess

    b64 = base64.b64encode(_png(images[0])).decode()
    parts = [{"type": "text", "text": "What is in"},
             {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
             {"type": "text", "text": " this picture?"}]
    ref = engine.chat([{"role": "user", "content": parts}], sampling_params=GREEDY)
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "a.png").write_bytes(_png(images[0]))
    srv = ServerProcess(mllama_dir, "--allowed-local-media-path", str(tmp_path / "media"))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        kwargs = dict(model=model, messages=[{"role": "user", "content": parts}], max_tokens=8,
                      temperature=0, extra_body={"ignore_eos": True})
        r = client.chat.completions.create(**kwargs)
        assert r.choices[0].message.content == ref["text"]
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **kwargs) if c.choices)
        assert streamed == ref["text"]
        # local files: only under the allowed directory, never elsewhere
        for url, ok in ((str(tmp_path / "media" / "a.png"), True),
                        (str(tmp_path / "elsewhere.png"), False), ("/etc/passwd", False)):
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "hi"}]}], "max_tokens": 2}
            resp = httpx.post(srv.url + "/v1/chat/completions", json=body)
            assert (resp.status_code == 200) == ok, resp.text
            if not ok:
                assert "image 0" in resp.json()["error"]["message"]
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    finally:
        assert srv.terminate() == 0


def test_repeated_images_hit_the_encoder_cache(engine, images):
    engine.flush_cache()
    before = engine.stats()["encoder_forwards"]
    a = engine.generate(prompt="<|image|>Describe", image_data=[images[0]], sampling_params=GREEDY)
    b = engine.generate(prompt="<|image|>Describe", image_data=[images[0]], sampling_params=GREEDY)
    # a new image next to a cached one: one encoder pass, for the new image only
    c = engine.generate(prompt="<|image|><|image|>Both", image_data=[images[0], images[2]],
                        sampling_params=GREEDY)
    stats = engine.stats()
    assert not a["meta_info"]["encoder_cache_hit"] and b["meta_info"]["encoder_cache_hit"]
    assert not c["meta_info"]["encoder_cache_hit"]
    assert b["output_ids"] == a["output_ids"]
    assert stats["encoder_forwards"] == before + 2
    assert b["meta_info"]["cached_tokens"] == 0  # prompt shorter than a KV page


def test_an_evicted_image_is_encoded_again_from_the_pixel_store(engine, images):
    """Every image reaches the scheduler as a PixelStore file; a repeated one is a cache hit,
    and if the scheduler has dropped it meanwhile (here: flush_cache) it reads the file again
    and serves the request as if new."""
    new = images[1].transpose(Image.Transpose.FLIP_LEFT_RIGHT)  # not used by other tests
    engine.flush_cache()
    before = engine.stats()
    gen = lambda: engine.generate(prompt="<|image|>Look", image_data=[new],  # noqa: E731
                                  sampling_params=GREEDY)
    a, b = gen(), gen()  # encoded, then a hit
    engine.flush_cache()
    c = gen()  # no longer cached: encoded again from its pixels, no round trip
    stats = engine.stats()
    assert [x["meta_info"]["encoder_cache_hit"] for x in (a, b, c)] == [False, True, False]
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]
    assert stats["encoder_forwards"] == before["encoder_forwards"] + 2
    engine.check_integrity()  # raises if a slot leaked


def test_an_image_evicted_to_the_host_tier_comes_back_without_the_vision_tower(
        mllama_dir, oracle, images):
    """A cross pool that holds one image: the second image evicts the first's cross K/V to
    the host tier (hidden-state tier off), and the first image's next request copies them
    back: no encoder pass, HF's output."""
    with Seq2SeqEngine(model_path=mllama_dir, device="cpu", page_size=4, max_cross_tokens=28,
                       max_images_per_request=1, max_image_pixels=200_000,
                       encoder_hidden_cache_mb=0, host_cache_gb=0.01) as engine:
        tok = oracle.processor.tokenizer
        ids = [IMAGE, tok.bos_token_id] + tok("Describe", add_special_tokens=False).input_ids
        def gen(img):
            return engine.generate(input_ids=ids, image_data=[img], sampling_params=GREEDY)

        a, _ = gen(images[0]), gen(images[1])
        before = engine.stats()
        c = gen(images[0])
        stats = engine.stats()
        assert c["meta_info"]["encoder_cache_hit"] and c["output_ids"] == a["output_ids"]
        assert stats["encoder_forwards"] == before["encoder_forwards"]  # no vision tower
        assert stats["encoder_projections"] == before["encoder_projections"]
        assert stats["encoder_cache_host_hits"] == before["encoder_cache_host_hits"] + 1
        assert c["output_ids"] == oracle.generate_ids(ids, [images[0]], 8)
        engine.check_integrity()
