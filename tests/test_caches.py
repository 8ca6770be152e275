"""The encoder cache (two tiers) and the radix cache: outputs unchanged, work skipped, memory
accounted for, and nothing shared across users under isolation."""

from __future__ import annotations

import random

import pytest

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.helpers import SOURCES, make_scheduler, request

MAX_NEW = 8


@pytest.fixture(scope="module")
def sources(t5_dir):
    tok = load_tokenizer(t5_dir)
    return [tok(s).input_ids for s in SOURCES]


def _drive(sched, arrivals: dict[int, list], check=True) -> dict[str, dict]:
    """Feed requests at the steps given; collect ids and the last output of each request."""
    out: dict[str, dict] = {}
    step = 0
    while sched.has_work or step <= max(arrivals, default=0):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            d = out.setdefault(o.rid, {"ids": []})
            d["ids"] += o.new_token_ids
            d["last"] = o
        if check:
            sched.check_integrity()
        step += 1
    return out


def _workload(sources, seed: int) -> dict[int, list]:
    """Repeated sources, shared forced decoder prefixes, staggered arrivals."""
    rng = random.Random(seed)
    prefixes = [[0], [0, 644, 19, 3, 9, 1566, 12, 5, 37, 629], [0, 644, 19, 3, 9, 1566, 12, 8]]
    arrivals: dict[int, list] = {}
    for i in range(24):
        src = sources[rng.randrange(4)]
        dec = prefixes[rng.randrange(3)]
        tr = request(f"r{i}", src, dec, max_new_tokens=rng.randrange(3, MAX_NEW + 1),
                     ignore_eos=True)
        arrivals.setdefault(rng.randrange(12), []).append(tr)
    return arrivals


@pytest.mark.parametrize("seed", [0, 1])
def test_caches_change_no_output_even_under_eviction(t5_dir, sources, seed):
    off = _drive(make_scheduler(t5_dir, disable_radix_cache=True, disable_encoder_cache=True),
                 _workload(sources, seed))
    # pools barely larger than one request's needs: constant eviction and retraction
    tight = make_scheduler(t5_dir, page_size=4, max_total_tokens=48,
                           max_cross_tokens=max(map(len, sources[:4])) + 12,
                           encoder_hidden_cache_mb=1)
    on = _drive(tight, _workload(sources, seed))
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    stats = tight.stats()
    assert stats["encoder_cache_hits"] > 0 and stats["radix_matched_tokens"] > 0
    assert stats["encoder_cache_evictions"] > 0 and stats["radix_evicted_tokens"] > 0
    tight.flush_cache()
    tight.check_integrity()
    assert tight.memory.usage()["kv_used_tokens"] == 0
    assert tight.memory.usage()["cross_used_tokens"] == 0


def test_repeated_source_skips_the_encoder(t5_dir, sources):
    sched = make_scheduler(t5_dir, page_size=4)
    first = _drive(sched, {0: [request("a", sources[3], max_new_tokens=4)]})
    passes = sched.encoder_stage.num_forwards
    again = _drive(sched, {0: [request("b", sources[3], max_new_tokens=4)]})
    assert sched.encoder_stage.num_forwards == passes  # no encoder pass
    assert not first["a"]["last"].encoder_cache_hit and again["b"]["last"].encoder_cache_hit
    assert again["b"]["ids"] == first["a"]["ids"]


def test_identical_inputs_in_one_batch_encode_once(t5_dir, sources):
    sched = make_scheduler(t5_dir)
    out = _drive(sched, {0: [request(f"n{i}", sources[1], max_new_tokens=4, temperature=1.0,
                                     seed=i) for i in range(4)]})
    assert sched.encoder_stage.num_forwards == 1
    assert sched.encoder_stage.num_encoded_inputs == 1  # four requests, one encoder input
    assert [out[f"n{i}"]["last"].encoder_cache_hit for i in range(4)] == [False] + [True] * 3


def test_warm_tier_recomputes_only_the_projections(t5_dir, sources):
    # a cross pool that holds one source at a time: the second source evicts the first's
    # K/V, whose hidden states stay in the warm tier
    need = max(len(sources[0]), len(sources[4]))
    sched = make_scheduler(t5_dir, page_size=4, max_cross_tokens=need + 4)
    ref = _drive(sched, {0: [request("a", sources[0], max_new_tokens=5)]})
    _drive(sched, {0: [request("b", sources[4], max_new_tokens=5)]})
    passes = sched.encoder_stage.num_forwards
    warm = _drive(sched, {0: [request("c", sources[0], max_new_tokens=5)]})
    assert sched.encoder_stage.num_forwards == passes  # no encoder pass ...
    assert sched.encoder_stage.num_projected_inputs == 1  # ... only the K/V projections
    assert warm["c"]["last"].encoder_cache_hit and warm["c"]["ids"] == ref["a"]["ids"]
    # without the warm tier the same sequence needs the encoder again
    cold = make_scheduler(t5_dir, page_size=4, max_cross_tokens=need + 4,
                          encoder_hidden_cache_mb=0)
    for rid, src in (("a", 0), ("b", 4), ("c", 0)):
        _drive(cold, {0: [request(rid, sources[src], max_new_tokens=5)]})
    assert cold.encoder_stage.num_forwards == 3


def test_shared_decoder_prefix_is_reused(t5_dir, sources):
    sched = make_scheduler(t5_dir, page_size=4)
    prefix = [0, 644, 19, 3, 9, 1566, 12, 5, 37, 629]
    a = _drive(sched, {0: [request("a", sources[2], prefix, max_new_tokens=3)]})
    b = _drive(sched, {0: [request("b", sources[2], prefix + [71], max_new_tokens=3)]})
    assert a["a"]["last"].cached_tokens == 0
    assert b["b"]["last"].cached_tokens == 8  # two whole pages of the shared prefix
    other = _drive(sched, {0: [request("c", sources[3], prefix, max_new_tokens=3)]})
    assert other["c"]["last"].cached_tokens == 0  # another source: another namespace


def test_isolation_keeps_users_apart(t5_dir, sources):
    sched = make_scheduler(t5_dir, page_size=4, cache_isolation="user")
    prefix = [0, 644, 19, 3, 9, 1566, 12, 5, 37, 629]

    def req(rid, user):
        tr = request(rid, sources[2], prefix, max_new_tokens=3)
        tr.user = user
        return tr

    alice = _drive(sched, {0: [req("a1", "alice")]})
    passes = sched.encoder_stage.num_forwards
    alice2 = _drive(sched, {0: [req("a2", "alice")]})
    bob = _drive(sched, {0: [req("b1", "bob")]})
    assert alice2["a2"]["last"].cached_tokens == 8 and alice2["a2"]["last"].encoder_cache_hit
    assert bob["b1"]["last"].cached_tokens == 0 and not bob["b1"]["last"].encoder_cache_hit
    assert sched.encoder_stage.num_forwards == passes + 1  # bob paid for his own encoder pass
    assert bob["b1"]["ids"] == alice["a1"]["ids"]


def test_llama_prompt_prefixes_are_shared(tmp_path):
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1))
    tok = load_tokenizer(path)
    system = tok("You are a helpful assistant. Answer briefly and precisely. " * 3).input_ids
    prompts = [system + tok(q, add_special_tokens=False).input_ids
               for q in ("What is two plus two?", "Name a colour.", "What is two plus three?")]

    def run(**kw):
        sched = make_scheduler(path, page_size=8, **kw)
        outs = {}
        for i, p in enumerate(prompts):  # one after another: each can reuse the last
            outs.update(_drive(sched, {0: [request(str(i), [], p, max_new_tokens=6,
                                                   ignore_eos=True)]}))
        return outs

    on, off = run(), run(disable_radix_cache=True)
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    assert on["0"]["last"].cached_tokens == 0
    assert on["1"]["last"].cached_tokens >= len(system) // 8 * 8
    assert all(v["last"].cached_tokens == 0 for v in off.values())


def _llama(tmp_path) -> tuple[str, list[int], list[list[int]]]:
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1))
    tok = load_tokenizer(path)
    system = tok("You are a helpful assistant. Answer briefly and precisely. " * 3).input_ids
    questions = [system + tok(q, add_special_tokens=False).input_ids
                 for q in ("What is two plus two?", "Name a colour.", "What is two plus three?",
                           "Say hello.", "Count to three.")]
    return path, system, questions


def _run_users(sched, prompts_users) -> dict:
    outs = {}
    for rid, prompt, user in prompts_users:  # one after another
        tr = request(rid, [], prompt, max_new_tokens=5, ignore_eos=True)
        tr.user = user
        outs.update(_drive(sched, {0: [tr]}))
    return outs


def test_shared_isolation_promotes_a_system_prompt_after_three_users(tmp_path):
    path, system, prompts = _llama(tmp_path)
    order = [("a1", prompts[0], "alice"), ("a2", prompts[1], "alice"), ("b1", prompts[2], "bob"),
             ("c1", prompts[3], "carol"), ("b2", prompts[4], "bob"), ("n1", prompts[0], None)]
    sched = make_scheduler(path, page_size=8, cache_isolation="shared",
                           cache_public_min_users=3)
    on = _run_users(sched, order)
    off = _run_users(make_scheduler(path, page_size=8, disable_radix_cache=True), order)
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    whole = len(system) // 8 * 8  # the system prompt's whole pages
    meta = {k: v["last"] for k, v in on.items()}
    assert meta["a1"].cached_tokens == 0 and meta["b1"].cached_tokens == 0  # no cross-user hit
    assert meta["a2"].cached_tokens >= whole  # alice's own copy
    assert meta["a2"].cache_hits["prefix_private_tokens"] == meta["a2"].cached_tokens
    # carol is the third user: the prompt becomes public and she hits it
    assert meta["c1"].cache_hits["prefix_public_tokens"] >= whole
    assert meta["b2"].cache_hits["prefix_public_tokens"] >= whole
    assert meta["n1"].cached_tokens >= whole
    stats = sched.stats()
    assert stats["radix_promotions"] >= 1 and stats["radix_merged_tokens"] >= whole
    # one copy of the system prompt: the pool holds exactly the tree, public part once
    assert sched.memory.token_to_kv.allocator.num_used * 8 == stats["radix_cache_tokens"]
    assert stats["radix_public_tokens"] < 2 * whole


def test_shared_isolation_encoder_entries(t5_dir, sources):
    def run(sched):
        out = {}
        for rid, user in (("a1", "alice"), ("b1", "bob"), ("b2", "bob"), ("c1", "carol"),
                          ("d1", "dave")):
            tr = request(rid, sources[3], max_new_tokens=4)
            tr.user = user
            out.update(_drive(sched, {0: [tr]}))
        return out

    sched = make_scheduler(t5_dir, page_size=4, cache_isolation="shared",
                           cache_public_min_users=3)
    on = run(sched)
    off = run(make_scheduler(t5_dir, disable_encoder_cache=True, disable_radix_cache=True))
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    hit = {k: v["last"].encoder_cache_hit for k, v in on.items()}
    assert hit == {"a1": False, "b1": False, "b2": True, "c1": True, "d1": True}
    assert on["c1"]["last"].cache_hits["encoder_public"] == 1
    assert sched.encoder_stage.num_encoded_inputs == 2  # alice's and bob's private passes
    stats = sched.stats()
    assert stats["encoder_cache_public_entries"] == 1 and stats["encoder_cache_private_entries"] == 0
    assert sched.memory.cross_kv.allocator.num_used == sched.memory.cross_kv.pages_for(
        len(sources[3]))  # one copy


def test_host_tier_serves_an_evicted_prefix_with_identical_output(tmp_path):
    path, system, prompts = _llama(tmp_path)
    filler = [[7 + i] * 40 for i in range(3)]  # unrelated prompts that evict the system prompt
    order = [("q0", prompts[0], None)] + [(f"f{i}", f, None) for i, f in enumerate(filler)] + \
        [("q1", prompts[1], None)]
    kw = {"page_size": 8, "max_total_tokens": 96}
    host = make_scheduler(path, host_cache_gb=0.001, **kw)
    on = _run_users(host, order)
    off = _run_users(make_scheduler(path, page_size=8, disable_radix_cache=True), order)
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    stats = host.stats()
    assert stats["radix_evicted_tokens"] > 0 and stats["radix_host_loaded_tokens"] > 0
    assert on["q1"]["last"].cached_tokens >= len(system) // 8 * 8
    # without the host tier the evicted prompt is recomputed
    plain = _run_users(make_scheduler(path, **kw), order)
    assert plain["q1"]["last"].cached_tokens < on["q1"]["last"].cached_tokens


def test_host_tier_serves_an_evicted_encoder_output_without_the_encoder(t5_dir, sources):
    need = max(len(sources[0]), len(sources[4]))
    sched = make_scheduler(t5_dir, page_size=4, max_cross_tokens=need + 4,
                           encoder_hidden_cache_mb=0, host_cache_gb=0.01)
    ref = _drive(sched, {0: [request("a", sources[0], max_new_tokens=5)]})
    _drive(sched, {0: [request("b", sources[4], max_new_tokens=5)]})  # evicts a's K/V
    passes = sched.encoder_stage.num_forwards
    again = _drive(sched, {0: [request("c", sources[0], max_new_tokens=5)]})
    assert sched.encoder_stage.num_forwards == passes  # no encoder pass ...
    assert sched.encoder_stage.num_projected_inputs == 0  # ... and no projection
    assert again["c"]["last"].encoder_cache_hit and again["c"]["ids"] == ref["a"]["ids"]
    stats = sched.stats()
    assert stats["encoder_cache_host_hits"] == 1 and stats["encoder_cache_host_stores"] >= 1


@pytest.mark.parametrize("isolation", ["none", "shared"])
def test_host_tier_under_pressure_changes_no_output_and_leaks_nothing(t5_dir, sources, isolation):
    off = _drive(make_scheduler(t5_dir, disable_radix_cache=True, disable_encoder_cache=True),
                 _workload(sources, 0))
    tight = make_scheduler(t5_dir, page_size=4, max_total_tokens=48,
                           max_cross_tokens=max(map(len, sources[:4])) + 12,
                           encoder_hidden_cache_mb=0, host_cache_gb=0.0002,
                           cache_isolation=isolation, cache_public_min_users=2)
    work = _workload(sources, 0)
    for i, tr in enumerate(tr for trs in work.values() for tr in trs):
        tr.user = f"u{i % 3}"  # (three users: their repeated sources become public)
    on = _drive(tight, work)  # integrity checked after every step
    assert {k: v["ids"] for k, v in on.items()} == {k: v["ids"] for k, v in off.items()}
    stats = tight.stats()
    assert stats["radix_host_stored_tokens"] > 0 and stats["encoder_cache_host_stores"] > 0
    assert stats["encoder_cache_host_hits"] > 0 and stats["radix_host_loaded_tokens"] > 0
    if isolation == "shared":
        assert stats["encoder_cache_promotions"] > 0
    tight.flush_cache()
    tight.check_integrity()
    usage = tight.memory.usage()
    assert usage["kv_used_tokens"] == usage["cross_used_tokens"] == 0
    assert tight.radix.host.allocator.num_used == 0
    assert tight.encoder_cache.host.allocator.num_used == 0


def test_engine_reports_public_and_private_hits(t5_dir):
    from seq2serve import Seq2SeqEngine
    from seq2serve.tests.helpers import hf_greedy

    tok = load_tokenizer(t5_dir)
    src = SOURCES[1]
    greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Seq2SeqEngine(model_path=t5_dir, device="cpu", max_total_tokens=2048,
                       max_cross_tokens=2048, cache_isolation="shared",
                       cache_public_min_users=2, host_cache_gb=0.01) as engine:
        outs = [engine.generate(prompt=src, sampling_params=greedy, user=u)
                for u in ("alice", "alice", "bob")]
        hits = [o["meta_info"]["cache_hits"] for o in outs]
        assert [h["encoder_private"] for h in hits] == [0, 1, 0]
        assert [h["encoder_public"] for h in hits] == [0, 0, 1]  # bob made it public
        ref = hf_greedy(t5_dir, tok(src).input_ids, 6)
        assert all(o["output_ids"] == ref for o in outs)
        stats = engine.stats()
        assert stats["encoder_cache_promotions"] == 1 and stats["encoder_cache_public_entries"] == 1
        engine.check_integrity()
