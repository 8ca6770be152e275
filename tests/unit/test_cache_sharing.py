"""`--cache-isolation shared` in the scheduler, through the fake executor: every prefix a
request gets from the radix cache (and every encoder-cache hit) is checked against a
reference model of the rules: an entry is private to each user who sent it until K distinct
users have sent it within one window, then public; a user sees public entries and their own.
"""

from __future__ import annotations

import random

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor
from seq2serve.tests.helpers import request

CONFIG = ModelConfig.from_path(str(default_demo_path()))
PS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SharingModel:
    """The rules, page by page: each page-aligned prefix (content) has the owners of its
    copies (or is public) and the distinct users who sent it in the current window."""

    def __init__(self, k: int, window: float, clock: Clock) -> None:
        self.k, self.window, self.clock = k, window, clock
        self.owners: dict[tuple, set] = {}  # content -> owners; {None}: public
        self.users: dict[tuple, tuple[int, set]] = {}  # content -> (epoch, users)

    def _touch(self, c: tuple, user: str) -> None:
        epoch = int(self.clock() // self.window)
        e, users = self.users.get(c, (epoch, set()))
        users = users if e == epoch else set()
        users.add(user)
        self.users[c] = (epoch, users)
        parent_public = len(c) == 2 or self.owners[c[:-1]] == {None}
        if len(users) >= self.k and parent_public:
            self.owners[c] = {None}

    def _contents(self, ns: tuple, tokens: list[int]):
        for i in range(len(tokens) // PS):
            yield (ns, *[tuple(tokens[j * PS:(j + 1) * PS]) for j in range(i + 1)])

    def match(self, ns: tuple, tokens: list[int], user: str) -> tuple[int, int]:
        """(visible pages, of them public) for `user`, counting the user on what exists."""
        visible = public = 0
        seen = True
        for c in self._contents(ns, tokens):
            if c not in self.owners:
                break
            self._touch(c, user)
            if seen and (self.owners[c] & {None, user}):
                visible += 1
                public += None in self.owners[c]
            else:
                seen = False
        return visible, public

    def insert(self, ns: tuple, tokens: list[int], user: str) -> None:
        for c in self._contents(ns, tokens):
            self.owners.setdefault(c, set())
            self._touch(c, user)
            if not self.owners[c] & {None, user}:
                self.owners[c].add(user)

    def copies(self, ns: tuple, tokens: list[int]) -> int:
        """Pages held for these tokens: one per owner of each content."""
        return sum(len(self.owners.get(c, ())) for c in self._contents(ns, tokens))


def scheduler(k: int = 3, window: float = 1000.0, kv_tokens: int = 8192,
              **args) -> tuple[Scheduler, Clock]:
    a = ServerArgs(model_path=CONFIG.model_path, device="cpu", page_size=PS,
                   cache_isolation="shared", cache_public_min_users=k,
                   cache_window_seconds=window, **args)
    sched = Scheduler(a, CONFIG, None, FakeExecutor(a, CONFIG, kv_tokens=kv_tokens))
    clock = Clock()
    sched.radix.sharing.clock = sched.encoder_cache.sharing.clock = clock
    return sched, clock


def watch(sched: Scheduler, model: SharingModel, exact: bool) -> list:
    """Check every radix lookup against the model as it happens (`exact`: equal; else no
    more than the model allows, for runs where eviction forgets entries)."""
    radix, seen = sched.radix, []
    match, insert = radix.match_prefix, radix.insert

    def checked_match(ns, tokens, user=None):
        got = match(ns, tokens, user)
        want = model.match(ns, tokens, user or "")
        pages = (len(got.pages), got.public_pages)
        seen.append((user, pages, want))
        if exact:
            assert pages == want, (user, pages, want)
        else:
            assert pages[0] <= want[0] and pages[1] <= want[1], (user, pages, want)
        return got

    def checked_insert(ns, tokens, pages, user=None, cached_pages=0):
        model.insert(ns, tokens, user or "")
        return insert(ns, tokens, pages, user, cached_pages)

    radix.match_prefix, radix.insert = checked_match, checked_insert
    return seen


def drive(sched: Scheduler, arrivals: dict[int, list], clock: Clock | None = None,
          tick: float = 1.0) -> dict[str, object]:
    out, step = {}, 0
    while sched.has_work or any(s >= step for s in arrivals):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            out[o.rid] = o
        sched.check_integrity()
        step += 1
        if clock is not None:
            clock.now += tick
    return out


def user_request(rid: str, user: str | None, decoder: list[int], source: int = 0,
                 new: int = 3):
    tr = request(rid, [100 + source, 7, 1], [0, *decoder], max_new_tokens=new, ignore_eos=True)
    tr.user = user
    return tr


SYSTEM = list(range(500, 523))  # 24 decoder tokens with the start token: 6 pages


def test_third_user_promotes_and_then_everyone_hits_one_copy():
    sched, _ = scheduler(k=3)
    model = SharingModel(3, 1000.0, Clock())
    watch(sched, model, exact=True)
    out = {}
    for rid, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        out.update(drive(sched, {0: [user_request(rid, user, SYSTEM + [7, 8])]}))
    # alice hits her own copy; bob sees nothing of alice's
    assert out["a1"].cached_tokens == 0 and out["a2"].cached_tokens == 24
    assert out["b1"].cached_tokens == 0
    stats = sched.stats()
    assert stats["radix_promotions"] == 0 and stats["radix_public_tokens"] == 0
    two_copies = stats["radix_private_tokens"]
    assert two_copies >= 2 * 24
    out.update(drive(sched, {0: [user_request("c1", "carol", SYSTEM + [9])]}))
    assert out["c1"].cached_tokens == 24 and out["c1"].cache_hits["prefix_public_tokens"] == 24
    stats = sched.stats()
    assert stats["radix_promotions"] >= 1
    assert stats["radix_public_tokens"] == 24  # one copy of the system prompt
    assert stats["radix_merged_tokens"] == 24  # the other user's copy, freed
    for rid, user in (("a3", "alice"), ("b2", "bob"), ("d1", "dave"), ("n1", None)):
        out.update(drive(sched, {0: [user_request(rid, user, SYSTEM + [11, 12, 13])]}))
        assert out[rid].cached_tokens >= 24, rid
    # idle, the pool holds exactly the tree's pages, the system prompt's once
    assert sched.memory.token_to_kv.allocator.num_used * PS == sched.stats()["radix_cache_tokens"]
    assert sched.stats()["radix_public_tokens"] >= 24
    assert sched.stats()["radix_private_tokens"] == \
        sched.stats()["radix_cache_tokens"] - sched.stats()["radix_public_tokens"]


def test_promotion_while_the_private_copies_are_read_frees_them_at_the_last_reader():
    sched, _ = scheduler(k=3)
    drive(sched, {0: [user_request("a1", "alice", SYSTEM)]})
    drive(sched, {0: [user_request("b1", "bob", SYSTEM)]})
    # alice and bob read their private copies while carol's request promotes them
    arrivals = {0: [user_request("a2", "alice", SYSTEM + [1], new=12),
                    user_request("b2", "bob", SYSTEM + [2], new=12)],
                2: [user_request("c1", "carol", SYSTEM + [3])]}
    out, retired, step = {}, [], 0
    while sched.has_work or step <= 2:
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        out.update((o.rid, o) for o in sched.step())
        sched.check_integrity()  # the retired pages are accounted for
        retired.append(sum(len(p) for n in sched.radix._nodes() for p in n.retired))
        step += 1
    assert out["a2"].cached_tokens == out["b2"].cached_tokens == 24
    assert out["c1"].cached_tokens == 24
    assert max(retired) == 6 and retired[-1] == 0  # bob's or alice's copy, held, then freed
    assert sched.stats()["radix_merged_tokens"] == 24
    sched.flush_cache()
    sched.check_integrity()
    assert sched.memory.token_to_kv.allocator.num_used == 0


def test_the_window_expires_promotion_counts():
    sched, clock = scheduler(k=3, window=10.0)
    drive(sched, {0: [user_request("a", "alice", SYSTEM + [5])]})
    drive(sched, {0: [user_request("b", "bob", SYSTEM + [5])]})
    clock.now = 25.0  # two windows later: alice and bob no longer count
    out = drive(sched, {0: [user_request("c", "carol", SYSTEM + [5])]})
    assert out["c"].cached_tokens == 0 and sched.stats()["radix_promotions"] == 0
    out = drive(sched, {0: [user_request("d", "dave", SYSTEM + [5])]})
    assert out["d"].cached_tokens == 0
    out = drive(sched, {0: [user_request("e", "erin", SYSTEM + [5])]})  # carol, dave, erin
    assert out["e"].cached_tokens == 24 and sched.stats()["radix_promotions"] >= 1


@pytest.mark.parametrize("seed", range(4))
def test_no_private_entry_serves_another_user_under_any_interleaving(seed):
    rng = random.Random(seed)
    k = 2 + seed % 3
    sched, clock = scheduler(k=k, window=40.0, disable_overlap_schedule=seed % 2 == 1)
    model = SharingModel(k, 40.0, clock)
    seen = watch(sched, model, exact=True)
    users = [f"u{i}" for i in range(12)] + [None]
    shared = [SYSTEM, SYSTEM[:9], SYSTEM + [44, 45, 46, 47, 48], list(range(900, 917))]
    arrivals: dict[int, list] = {}
    own = {u: [rng.randrange(2, 300) for _ in range(10)] for u in users}  # resent by its user
    for i in range(90):
        user, r = rng.choice(users), rng.random()
        base = rng.choice(shared) if r < 0.6 else own[user] if r < 0.85 else []
        tail = [rng.randrange(2, 300) for _ in range(rng.randrange(0, 9))]
        tr = user_request(f"r{i}", user, base + tail, source=rng.randrange(2),
                          new=rng.randrange(1, 7))
        arrivals.setdefault(rng.randrange(160), []).append(tr)
    out = drive(sched, arrivals, clock, tick=1.0)
    assert len(out) == 90
    hits = [p for _, p, _ in seen if p[0]]
    assert any(p[1] for p in hits) and any(p[0] > p[1] for p in hits)  # public and private
    sched.flush_cache()
    sched.check_integrity()
    assert sched.memory.token_to_kv.allocator.num_used == 0


@pytest.mark.parametrize("seed, host_gb", [(0, 0.0), (1, 0.0), (0, 1e-4), (1, 1e-4)])
def test_under_eviction_no_user_sees_more_than_the_rules_allow(seed, host_gb):
    """(With a host tier, copies go there and come back under the same rules.)"""
    rng = random.Random(seed)
    sched, clock = scheduler(k=2, kv_tokens=128, max_running_requests=3, host_cache_gb=host_gb)
    model = SharingModel(2, 1000.0, clock)
    seen = watch(sched, model, exact=False)
    arrivals: dict[int, list] = {}
    users = ["a", "b", "c", "d", None]
    own = {u: [rng.randrange(2, 300) for _ in range(14)] for u in users}  # resent by its user
    for i in range(60):
        user = rng.choice(users)
        base = rng.choice([SYSTEM, SYSTEM[:13], list(range(900, 917)), own[user], own[user]])
        tail = [rng.randrange(2, 300) for _ in range(rng.randrange(0, 9))]
        tr = user_request(f"r{i}", user, base + tail, new=rng.randrange(1, 9))
        arrivals.setdefault(rng.randrange(80), []).append(tr)
    drive(sched, arrivals, clock)
    stats = sched.stats()
    assert stats["radix_evicted_tokens"] > 0 and any(p[0] for _, p, _ in seen)
    assert bool(host_gb) == (stats.get("radix_host_loaded_tokens", 0) > 0)
    sched.flush_cache()
    sched.check_integrity()
    assert sched.memory.token_to_kv.allocator.num_used == 0


def test_encoder_entries_are_private_until_k_users_send_the_input():
    sched, clock = scheduler(k=3, window=50.0)
    out = {}
    for rid, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        out.update(drive(sched, {0: [user_request(rid, user, [], source=5)]}))
    encodes = sched.encoder_stage.num_encoded_inputs
    assert encodes == 2  # alice once (her second request hit), bob once
    assert out["a2"].encoder_cache_hit and not out["b1"].encoder_cache_hit
    assert out["a2"].cache_hits == {"prefix_public_tokens": 0, "prefix_private_tokens": 0,
                                    "encoder_public": 0, "encoder_private": 1}
    stats = sched.stats()
    assert stats["encoder_cache_private_entries"] == 2 and stats["encoder_cache_public_entries"] == 0
    used = sched.memory.cross_kv.allocator.num_used
    out.update(drive(sched, {0: [user_request("c1", "carol", [], source=5)]}))
    assert out["c1"].encoder_cache_hit and out["c1"].cache_hits["encoder_public"] == 1
    assert sched.encoder_stage.num_encoded_inputs == encodes  # carol ran no encoder
    stats = sched.stats()
    assert stats["encoder_cache_public_entries"] == 1 and stats["encoder_cache_private_entries"] == 0
    assert stats["encoder_cache_promotions"] == 1
    assert sched.memory.cross_kv.allocator.num_used == used // 2  # one copy left
    assert stats["encoder_cache_merged_tokens"] == used // 2 * PS
    out.update(drive(sched, {0: [user_request("n1", None, [], source=5)]}))
    assert out["n1"].encoder_cache_hit
    # a new window: another input's count starts again
    clock.now = 200.0
    for rid, user in (("x1", "xavier"), ("y1", "yann")):
        out.update(drive(sched, {0: [user_request(rid, user, [], source=6)]}))
        assert not out[rid].encoder_cache_hit
    clock.now = 300.0
    out.update(drive(sched, {0: [user_request("z1", "zoe", [], source=6)]}))
    assert not out["z1"].encoder_cache_hit  # xavier and yann were counted two windows ago


def test_encoder_promotion_while_referenced_detaches_then_frees():
    sched, _ = scheduler(k=2)
    out = drive(sched, {0: [user_request("a", "alice", [], source=3),
                            user_request("b", "bob", [], source=3)]})
    assert sched.stats()["encoder_cache_promotions"] == 1  # bob was the second user
    assert out["b"].cache_hits["encoder_public"] == 1  # (alice's K/V, written in that step)
    assert sched.encoder_stage.num_encoded_inputs == 1
    sched, _ = scheduler(k=3)
    for rid, user in (("a1", "alice"), ("b1", "bob")):
        drive(sched, {0: [user_request(rid, user, [], source=3)]})
    used = sched.memory.cross_kv.allocator.num_used
    # alice and bob read their private entries while carol's request merges them
    seen = []

    def look(step: int) -> None:
        seen.append((len(sched.encoder_cache.detached),
                     sched.memory.cross_kv.allocator.num_used))

    arrivals = {0: [user_request("a2", "alice", [], source=3, new=12),
                    user_request("b2", "bob", [], source=3, new=12)],
                2: [user_request("c1", "carol", [], source=3)]}
    step = 0
    while sched.has_work or step <= 2:
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        sched.step()
        sched.check_integrity()
        look(step)
        step += 1
    assert (1, used) in seen  # one private entry detached, its pages still held
    assert seen[-1] == (0, used // 2)  # freed when its last reader finished
    assert sched.stats()["encoder_cache_merged_tokens"] == used // 2 * PS


def test_metrics_report_scopes_promotions_merges_and_the_host_tier():
    from prometheus_client.parser import text_string_to_metric_families

    from seq2serve.runtime.frontend.metrics import ServerMetrics

    sched, _ = scheduler(k=2, kv_tokens=96, host_cache_gb=0.001)
    for rid, user in (("a", "alice"), ("b", "bob"), ("c", "carol")):
        drive(sched, {0: [user_request(rid, user, SYSTEM + [1], source=1)]})
    for i in range(4):  # dave's private prompts push each other to the host tier
        drive(sched, {0: [user_request(f"f{i}", "dave", [30 + i] * 40, source=2)]})
    assert sched.stats()["radix_evicted_tokens"] > 0
    # the public prompt (two users) outlived dave's (one each) on the device
    out = drive(sched, {0: [user_request("d", "erin", SYSTEM + [2], source=1)]})
    assert out["d"].cache_hits["prefix_public_tokens"] == 24
    assert sched.stats()["radix_host_loaded_tokens"] == 0
    out = drive(sched, {0: [user_request("f0again", "dave", [30] * 40, source=2)]})
    assert out["f0again"].cached_tokens == 40  # back from the host tier
    stats = sched.stats()
    assert stats["radix_host_loaded_tokens"] > 0 and stats["radix_promotions"] > 0
    metrics = ServerMetrics()
    metrics.set_scheduler_stats(stats)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}

    def value(name, **labels):
        return got[(name, tuple(sorted(labels.items())))]

    assert value("seq2serve_cache_promotions", cache="radix") == stats["radix_promotions"]
    assert value("seq2serve_cache_promotions", cache="encoder") == 1
    assert value("seq2serve_cache_merged_tokens", cache="radix") == stats["radix_merged_tokens"]
    assert value("seq2serve_cache_scoped", cache="radix", scope="private") == \
        stats["radix_private_tokens"]
    assert value("seq2serve_cache_scoped", cache="encoder", scope="public") == \
        stats["encoder_cache_public_entries"]
    assert value("seq2serve_host_cache_loads", cache="radix") == stats["radix_host_loaded_tokens"]
    assert value("seq2serve_host_cache_tokens", cache="encoder") == \
        stats["encoder_cache_host_tokens"]


@pytest.mark.parametrize("kwargs, field", [
    ({"cache_isolation": "tenant"}, "cache_isolation"),
    ({"cache_public_min_users": 0}, "cache_public_min_users"),
    ({"cache_public_min_users": 65}, "cache_public_min_users"),
    ({"cache_window_seconds": 0}, "cache_window_seconds"),
    ({"host_cache_gb": -1.0}, "host_cache_gb"),
])
def test_bad_options_name_the_option(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ServerArgs(**kwargs)


def test_host_pool_gives_back_exactly_what_it_took():
    import torch

    from seq2serve.runtime.memory.host_kv_pool import HostKVPool, host_pools
    from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool

    pool = TokenToKVPool(12, PS, 3, 2, 5, torch.float32, "cpu")
    torch.manual_seed(0)
    pool._k.normal_()
    pool._v.normal_()
    src = [7, 2, 9]
    want_k = pool._k.view(3, -1, PS, 2, 5)[:, src].clone()
    want_v = pool._v.view(3, -1, PS, 2, 5)[:, src].clone()
    host = HostKVPool(pool, 6)
    held = host.allocator.alloc(3)
    host.store(src, held)
    pool._k.zero_()
    pool._v.zero_()
    dst = [4, 11, 1]
    host.load(held, dst)
    assert torch.equal(pool._k.view(3, -1, PS, 2, 5)[:, dst], want_k)
    assert torch.equal(pool._v.view(3, -1, PS, 2, 5)[:, dst], want_v)
    others = [p for p in range(1, 13) if p not in dst]
    assert not pool._k.view(3, -1, PS, 2, 5)[:, others].any()  # no other page written
    # the budget is split equally between the pools present
    small = TokenToKVPool(4, PS, 1, 2, 5, torch.float32, "cpu")  # a third of the page bytes
    gb = HostKVPool.page_bytes(pool) * 16 / (1 << 30)
    a, b = host_pools(gb, pool, small)
    assert (a.allocator.num_pages, b.allocator.num_pages) == (8, 24)
    (c, d) = host_pools(gb, pool, None)
    assert c.allocator.num_pages == 16 and d is None
    assert host_pools(0.0, pool, small) == [None, None]
