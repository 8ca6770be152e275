"""The data-parallel router, the replica layout, the link's sockets and the merged replies,
without a model: keys and counts in, replicas out."""

from __future__ import annotations

import random
import types
import uuid

import pytest
import zmq

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.frontend.dp_router import (
    BLOCK_TOKENS,
    DataParallelRouter,
    request_cost,
    routing_keys,
)
from seq2serve.runtime.frontend.metrics import ServerMetrics
from seq2serve.runtime.frontend.replica_layout import plan_replicas
from seq2serve.runtime.frontend.replica_replies import merge_replies, merge_stats
from seq2serve.runtime.frontend.scheduler_link import SchedulerLink
from seq2serve.runtime.messages.io_struct import AbortRequest, ControlReply, TokenizedRequest


def _req(enc: list[int] | None = None, dec: list[int] | None = None, images=(),
         max_new: int = 8, rid: str | None = None) -> TokenizedRequest:
    enc = enc or []
    return TokenizedRequest(rid=rid or uuid.uuid4().hex, encoder_input_ids=enc,
                            decoder_input_ids=dec or [0],
                            sampling_params=SamplingParams(max_new_tokens=max_new),
                            encoder_key=f"src-{','.join(map(str, enc))}" if enc else None,
                            encoder_inputs=list(images))


def _image(key: str, tokens: int = 100):
    return types.SimpleNamespace(key=key, num_tokens=tokens)


def _route(router: DataParallelRouter, r: TokenizedRequest) -> int:
    return router.route(routing_keys(r), request_cost(r))


def test_a_repeated_source_goes_back_to_its_replica_and_new_ones_spread():
    router = DataParallelRouter(3)
    sources = [[i, i + 1, i + 2] for i in range(30)]
    first = [_route(router, _req(s)) for s in sources]
    assert sorted(set(first)) == [0, 1, 2]  # least loaded: all three get work
    assert max(first.count(r) for r in range(3)) - min(first.count(r) for r in range(3)) <= 1
    order = list(range(30))
    random.Random(0).shuffle(order)
    for i in order:  # repeats, in another order, come back to where they were cached
        assert _route(router, _req(sources[i])) == first[i]
    assert router.stats()["routed_affinity"] == [first.count(r) for r in range(3)]


def test_a_repeated_image_goes_back_to_its_replica():
    router = DataParallelRouter(2)
    a = _route(router, _req(dec=[5, 6], images=[_image("cat")]))
    b = _route(router, _req(dec=[5, 6], images=[_image("dog")]))
    assert a != b  # the second went to the idle replica
    # another prompt about the dog, and one with both images: the one whose images save more
    assert _route(router, _req(dec=[9, 9, 9], images=[_image("dog")])) == b
    assert _route(router, _req(dec=[7], images=[_image("cat", 10), _image("dog", 300)])) == b


def test_the_longest_cached_decoder_prefix_wins():
    router = DataParallelRouter(2)
    system = list(range(100, 100 + 2 * BLOCK_TOKENS))
    first = _route(router, _req(dec=system[:BLOCK_TOKENS] + [1, 2, 3]))
    # a prompt that shares its first block follows it there (and caches its second block)
    both = _route(router, _req(dec=system + [4, 5]))
    assert both == first
    # where one replica holds one block of the prompt and the other both, the other wins
    keys = routing_keys(_req(dec=system + [6, 7, 8]))
    router.table[keys[0].key], router.table[keys[1].key] = 1, 0
    assert router._affinity(keys) == 0
    router.table[keys[0].key], router.table[keys[1].key] = 0, 1
    assert router._affinity(keys) == 1
    # a prompt shorter than a block has only its whole-prompt key: repeats meet, others spread
    short = _route(router, _req(dec=[9, 8, 7]))
    assert _route(router, _req(dec=[9, 8, 7])) == short


def test_outstanding_load_is_released_and_steers_new_requests():
    router = DataParallelRouter(2)
    big = _req(enc=[1] * 50, max_new=500)
    small = [_req(enc=[2, i]) for i in range(5)]
    rb = _route(router, big)
    rs = [_route(router, r) for r in small]
    assert all(r != rb for r in rs)  # 550 tokens outstanding there; 5 small ones fit the other
    router.release(rb, request_cost(big))
    for r, req in zip(rs, small):
        router.release(r, request_cost(req))
    assert router.tokens == [0, 0] and router.requests == [0, 0]
    with pytest.raises(AssertionError):
        router.release(0, 1)  # a release without its route


def test_affinity_yields_to_a_much_busier_replica():
    router = DataParallelRouter(2, balance_abs=4, balance_rel=1.5)
    hot = _req(enc=[7, 7, 7], max_new=1)
    home = _route(router, hot)
    for i in range(4):  # its replica fills up with the same source (affinity)
        assert _route(router, _req(enc=[7, 7, 7], max_new=1)) == home
    # now 5 outstanding against 0 (> 0 + 4 and > 1.5 x 0): the next goes elsewhere
    assert _route(router, _req(enc=[7, 7, 7], max_new=1)) != home


def test_the_affinity_table_stays_bounded():
    router = DataParallelRouter(2, max_keys=500)
    kept = _req(enc=[1, 2, 3])
    home = _route(router, kept)
    for i in range(20_000):
        r = _req(enc=[i, i], dec=[0] + [i % 97] * 40)  # several keys each
        router.release(_route(router, r), request_cost(r))
        if i % 50 == 0:  # a source used now and then stays (least recently used goes first)
            assert _route(router, kept) == home
            router.release(home, request_cost(kept))
        assert len(router.table) <= 500
    gone = _req(enc=[5, 5])  # seen at i = 5, long evicted: no affinity left
    keys = routing_keys(gone)
    assert all(k.key not in router.table for k in keys)


def test_encoder_decoder_prefixes_are_per_source():
    # T5's decoder prompt is the start token for every request: it must not pull all
    # requests to one replica
    router = DataParallelRouter(2)
    picks = [_route(router, _req(enc=[i, 1, 2], dec=[0])) for i in range(10)]
    assert picks.count(0) == picks.count(1) == 5


def test_replica_layout_slices_the_visible_gpus():
    args = types.SimpleNamespace(dp_size=2, device="cuda", tp_size=2)
    plan = plan_replicas(args, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert [p.gpus for p in plan] == [("4", "5"), ("6", "7")]
    assert [p.env for p in plan] == [{"CUDA_VISIBLE_DEVICES": "4,5"},
                                     {"CUDA_VISIBLE_DEVICES": "6,7"}]
    assert all(p.args is args for p in plan)  # server args pass through unchanged
    plan = plan_replicas(types.SimpleNamespace(dp_size=3, device=None), environ={},
                         gpu_count=3)
    assert [p.gpus for p in plan] == [("0",), ("1",), ("2",)]
    with pytest.raises(ValueError, match="need 4 GPUs, 3 visible"):
        plan_replicas(args, environ={"CUDA_VISIBLE_DEVICES": "0,1,2"})


def test_replica_layout_on_the_cpu_and_with_one_replica():
    one = ServerArgs(model_path="m", device="cpu")
    assert [(p.args, p.env, p.gpus) for p in plan_replicas(one)] == [(one, {}, ())]
    two = ServerArgs(model_path="m", device="cpu", dp_size=2, mem_fraction=0.8)
    plan = plan_replicas(two, environ={"OMP_NUM_THREADS": "3"})
    assert [p.args.mem_fraction for p in plan] == [0.4, 0.4]  # the host's memory is shared
    assert [p.env for p in plan] == [{"OMP_NUM_THREADS": "3"}] * 2


@pytest.mark.parametrize("kwargs, needle", [
    ({"dp_size": 0}, "dp_size must be a positive integer"),
    ({"dp_size": 2, "device": "cuda:1"}, "CUDA_VISIBLE_DEVICES"),
])
def test_bad_dp_options_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ServerArgs(model_path="m", **kwargs)


def test_the_link_sends_each_replica_its_share_and_aborts_where_a_request_runs(tmp_path):
    ctx = zmq.Context()
    ends = tuple(f"ipc://{tmp_path}/r{i}" for i in range(2))
    pulls = [ctx.socket(zmq.PULL) for _ in ends]
    for s, e in zip(pulls, ends):
        s.bind(e)
    link = SchedulerLink(ctx, ends)
    try:
        reqs = [_req(enc=[i, 3], rid=f"r{i}") for i in range(4)]
        link.send(reqs)
        got = [s.recv_pyobj() for s in pulls]  # one message (a list) per replica
        assert sorted(r.rid for share in got for r in share) == ["r0", "r1", "r2", "r3"]
        where = {r.rid: i for i, share in enumerate(got) for r in share}
        assert where == link.replica_of
        link.abort("r2")
        assert pulls[where["r2"]].recv_pyobj() == AbortRequest("r2")
        assert pulls[1 - where["r2"]].poll(100) == 0
        link.finished(reqs)
        assert link.replica_of == {} and link.router.requests == [0, 0]
        link.abort("unknown")  # not known: every replica is asked
        assert all(s.recv_pyobj() == AbortRequest("unknown") for s in pulls)
    finally:
        link.close()
        for s in pulls:
            s.close()
        ctx.term()


def test_merged_stats_and_integrity():
    stats = merge_stats([{"running_requests": 2, "max_batch_size": 8, "device": "cpu",
                          "forwards_by_mode": {"decode": 5}},
                         {"running_requests": 3, "max_batch_size": 4, "device": "cpu",
                          "forwards_by_mode": {"decode": 1, "extend": 2}}])
    assert stats["running_requests"] == 5 and stats["max_batch_size"] == 8
    assert stats["forwards_by_mode"] == {"decode": 6, "extend": 2}
    assert [r["replica"] for r in stats["replicas"]] == [0, 1]
    reply = merge_replies("check_integrity", "t", [
        ControlReply("check_integrity", "a", True, {"idle": True}),
        ControlReply("check_integrity", "b", False, {"error": "3 pages leaked"})])
    assert not reply.ok and reply.payload["error"] == "replica 1: 3 pages leaked"


def test_metrics_carry_a_replica_label_only_with_several():
    per = {"running_requests": 1, "waiting_requests": 0, "kv_used_tokens": 4,
           "kv_total_tokens": 16}
    two = ServerMetrics(replicas=2)
    two.set_stats({**merge_stats([per, {**per, "running_requests": 7}]),
                   "router": {"routed_affinity": [1, 2], "routed_least_loaded": [3, 4],
                              "outstanding_requests": [1, 7]}})
    text = two.render().decode()
    assert 'seq2serve_num_running_reqs{replica="0"} 1.0' in text
    assert 'seq2serve_num_running_reqs{replica="1"} 7.0' in text
    assert 'seq2serve_dp_routed_requests{reason="least_loaded",replica="1"} 4.0' in text
    one = ServerMetrics()
    one.set_stats(per)
    assert "seq2serve_num_running_reqs 1.0" in one.render().decode()


def test_idle_replicas_take_turns():
    # one request at a time, each ended before the next: every replica is idle each time
    router = DataParallelRouter(3)
    picks = []
    for i in range(9):
        r = _req(enc=[i, 42])
        picks.append(_route(router, r))
        router.release(picks[-1], request_cost(r))
    assert picks == [0, 1, 2] * 3


def test_the_frontend_checks_requests_against_the_smallest_replica():
    from seq2serve.runtime.frontend.launch import _combined

    base = {"vocab_size": 100, "input_vocab_size": 100, "is_encoder_decoder": True,
            "context_length": 512, "max_encoder_len": 512, "device": "cuda:0"}
    info = _combined([{**base, "kv_capacity_tokens": 9000, "cross_capacity_tokens": 800},
                      {**base, "kv_capacity_tokens": 7000, "cross_capacity_tokens": 900}])
    assert (info["kv_capacity_tokens"], info["cross_capacity_tokens"]) == (7000, 800)
    assert info["dp_size"] == 2 and info["is_encoder_decoder"] is True


# --- issue 39: the router sees no more than the caches (RouteScopes) --------------------------

def _scoped_link(mode: str, clock=None):
    from seq2serve.runtime.config.server_args import CacheIsolation
    from seq2serve.runtime.frontend.route_scopes import RouteScopes

    router = DataParallelRouter(2)
    scopes = RouteScopes(CacheIsolation(mode, 3, 600.0), clock=clock or (lambda: 0.0))

    def send(user, enc):
        r = _req(enc)
        r.user = user
        lookup, record = scopes.keys(r)
        before = sum(router.routed["affinity"])
        replica = router.route(lookup, request_cost(r), record)
        router.release(replica, request_cost(r))
        return replica, sum(router.routed["affinity"]) > before

    return send


@pytest.mark.parametrize("mode", ["user", "shared"])
def test_another_users_source_is_no_affinity(mode):
    send = _scoped_link(mode)
    first, _ = send("alice", [5, 6, 7])
    assert send("bob", [5, 6, 7])[1] is False  # routed by load: nothing says alice sent it
    assert send("alice", [5, 6, 7]) == (first, True)  # her own entry still counts
    assert send(None, [5, 6, 7])[1] is False  # the anonymous user is one user too
    assert send(None, [5, 6, 7])[1] is True


def test_shared_isolation_routes_by_public_entries_only():
    send = _scoped_link("shared")
    assert [send(u, [1, 2, 3])[1] for u in ("a", "b", "c")] == [False, False, False]
    assert send("d", [1, 2, 3])[1] is True  # three users sent it: public, as in the caches


def test_no_isolation_routes_across_users():
    send = _scoped_link("none")
    send("alice", [5, 6, 7])
    assert send("bob", [5, 6, 7])[1] is True


def test_stats_of_replicas_report_the_true_tp_size():
    merged = merge_stats([{"tp_size": 1, "tp_devices": ["cpu"], "forwards": 3},
                          {"tp_size": 1, "tp_devices": ["cpu"], "forwards": 4}])
    assert merged["tp_size"] == 1 and merged["dp_size"] == 2 and merged["forwards"] == 7
    assert merged["tp_devices"] == ["cpu", "cpu"]


def test_rids_are_scoped_by_user_without_ambiguity():
    from seq2serve.runtime.frontend.request_ids import client_rid, scoped_rid

    keys = {scoped_rid(u, r) for u, r in (("a", "b:c"), ("a:b", "c"), (None, "x"), ("", "x"),
                                          ("bob", "x"))}
    assert len(keys) == 4  # None and "" are the one anonymous user
    assert client_rid(scoped_rid("a:b", "c:d")) == "c:d"
    assert client_rid(scoped_rid("al", "r") + "-1") == "r-1"


@pytest.mark.parametrize("header,token", [(b"Bearer k1", b"k1"), (b"bearer k1", b"k1"),
                                          (b"BEARER  k1 ", b"k1"), (b"Basic k1", None),
                                          (b"k1", None), (b"Bearer", None)])
def test_the_authorization_scheme_is_case_insensitive(header, token):
    from seq2serve.runtime.frontend.http_middleware import bearer_token

    assert bearer_token([(b"authorization", header)]) == token


def test_each_replica_has_its_own_rendezvous_port():
    args = ServerArgs(model_path="m", device="cpu", dp_size=2, tp_size=2, dist_init_port=29600)
    assert [p.args.dist_init_port for p in plan_replicas(args, environ={})] == [29600, 29601]
    with pytest.raises(ValueError, match="dist_init_port"):
        ServerArgs(model_path="m", dist_init_port=70000)
