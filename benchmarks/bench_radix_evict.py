#!/usr/bin/env python3
"""Evicting from a radix cache full of finished requests' prefixes, as a server's is after a
few thousand distinct sources: the cost of each make_room-sized eviction."""
import random, time, sys
from seq2serve.runtime.memory.page_allocator import PageAllocator
from seq2serve.runtime.scheduler.radix_cache import RadixCache

ps, n_src, pages_per = 16, int(sys.argv[1]) if len(sys.argv) > 1 else 2048, 12
alloc = PageAllocator(n_src * pages_per + 64)
rc = RadixCache(alloc, ps, enabled=True)
rng = random.Random(0)
for s in range(n_src):
    toks = [rng.randrange(32000) for _ in range(pages_per * ps)]
    pages = alloc.alloc(pages_per)
    rc.insert((f"src{s}",), toks, pages)
t = time.perf_counter(); calls = 0; freed = 0
while freed < 256 * pages_per // 4:
    freed += rc.evict(1); calls += 1
dt = time.perf_counter() - t
print(f"{n_src} sources: {calls} evictions of one page, {dt / calls * 1e3:.2f} ms each")
t = time.perf_counter(); f = rc.evict(64 * pages_per); dt = time.perf_counter() - t
print(f"one eviction of {f} pages: {dt * 1e3:.1f} ms")
