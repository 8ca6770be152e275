"""/v1/embeddings through the unmodified `openai` client: each input's encoder output (HF's
`get_encoder()(ids).last_hidden_state`) averaged over all its tokens, EOS included, and
L2-normalised, in float32 within 1e-5, for T5 and BART; "float" and the client's default
"base64"; a source generated from first is embedded from the encoder cache, without another
encoder pass; a decoder-only model and refused fields are 400s naming the problem."""

from __future__ import annotations

from functools import lru_cache

import httpx
import pytest
import torch

from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.bart_cnn_checkpoints import write_bart_cnn_checkpoint
from seq2serve.tests.helpers import T5_CONFIGS, make_t5
from seq2serve.tests.server_helpers import ServerProcess

openai = pytest.importorskip("openai")

TEXTS = ["The house is wonderful.", "Hi", "summarize: studies have shown that owning a dog "
         "is good for you, and that cats are fine too."]


@pytest.fixture(scope="module", params=["t5", "bart"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    path = str(make_t5(root / "t5", **T5_CONFIGS["mt5_gated_untied"]) if request.param == "t5"
               else write_bart_cnn_checkpoint("scaled_untied", root / "bart", seed=2))
    server = ServerProcess(path, "--dtype", "float32")
    try:
        yield path, server
    finally:
        server.kill()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@lru_cache(maxsize=4)
def _hf(path: str):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def hf_embedding(path: str, ids: list[int]) -> torch.Tensor:
    model, _ = _hf(path)
    hidden = model.get_encoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(hidden.mean(0), dim=-1)


def _check(path: str, texts: list[str], got) -> None:
    _, tok = _hf(path)
    assert [d.index for d in got.data] == list(range(len(texts)))
    ids = [tok(t).input_ids for t in texts]
    assert got.usage.prompt_tokens == sum(map(len, ids))
    for d, i in zip(got.data, ids):
        vector = torch.tensor(d.embedding, dtype=torch.float32)
        assert torch.allclose(vector, hf_embedding(path, i), atol=1e-5, rtol=0)


def test_float_and_base64_embeddings_equal_hfs_pooled_encoder_output(served):
    path, server = served
    client = _client(server)
    _check(path, TEXTS, client.embeddings.create(model=path, input=TEXTS,
                                                 encoding_format="float"))
    _check(path, TEXTS[:1], client.embeddings.create(model=path, input=TEXTS[0]))  # base64
    raw = httpx.post(server.url + "/v1/embeddings",
                     json={"input": TEXTS[1], "encoding_format": "base64"}).json()
    assert isinstance(raw["data"][0]["embedding"], str)  # the client decoded that one
    _, tok = _hf(path)
    ids = tok(TEXTS[2]).input_ids  # token ids as input
    got = client.embeddings.create(model=path, input=ids, encoding_format="float")
    assert torch.allclose(torch.tensor(got.data[0].embedding), hf_embedding(path, ids),
                          atol=1e-5, rtol=0)


def test_a_generated_sources_embedding_costs_no_encoder_pass(served):
    path, server = served
    text = "A sentence that is new to this server, generated from first."
    httpx.post(server.url + "/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": 2, "temperature": 0}}, timeout=60).raise_for_status()
    before = httpx.get(server.url + "/debug/stats", timeout=10).json()
    got = _client(server).embeddings.create(model=path, input=text, encoding_format="float")
    after = httpx.get(server.url + "/debug/stats", timeout=10).json()
    _check(path, [text], got)
    assert after["encoder_forwards"] == before["encoder_forwards"]


def test_bad_requests_are_400s_naming_the_problem(served):
    path, server = served
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=path, input="hi", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="empty list"):
        client.embeddings.create(model=path, input=[])
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "hi", "encoding_format": "hex"})
    assert r.status_code == 400 and "encoding_format" in r.text


def test_a_decoder_only_model_is_a_400(tmp_path):
    path = str(write_llama_checkpoint(tmp_path / "llama", hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1))
    server = ServerProcess(path)
    try:
        with pytest.raises(openai.BadRequestError, match="text encoder.*LlamaForCausalLM"):
            _client(server).embeddings.create(model=path, input="hello")
    finally:
        server.kill()


def test_the_engine_embeds_as_the_endpoint_does(tmp_path):
    """Seq2SeqEngine.embed: one vector for one text, a list for a list, equal to HF's pooled
    encoder output; a decoder-only model is a ValueError naming it."""
    from seq2serve import Seq2SeqEngine

    path = str(make_t5(tmp_path / "t5", **T5_CONFIGS["mt5_gated_untied"]))
    _, tok = _hf(path)
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        one = engine.embed(TEXTS[0])
        many = engine.embed(TEXTS)
        by_ids = engine.embed(input_ids=tok(TEXTS[1]).input_ids)
    assert isinstance(one[0], float) and len(many) == len(TEXTS)
    for text, got in [(TEXTS[0], one), *zip(TEXTS, many), (TEXTS[1], by_ids)]:
        want = hf_embedding(path, tok(text).input_ids)
        torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=0)
    llama = write_llama_checkpoint(tmp_path / "llama")
    with Seq2SeqEngine(model_path=str(llama), device="cpu") as engine:
        with pytest.raises(ValueError, match="LlamaForCausalLM"):
            engine.embed("hello")
