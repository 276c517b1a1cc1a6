"""``ThreadCache``: each call runs at once on a thread of its own, and idle threads are reused."""

from __future__ import annotations

import threading

from millm_host.threadcache import ThreadCache


def test_calls_never_wait_behind_each_other_and_idle_threads_are_reused():
    cache = ThreadCache("test-cache", idle_s=5)
    release = threading.Event()
    started = threading.Barrier(9)  # eight blocked calls and this thread: all run at once
    names: list[str] = []

    def blocked() -> None:
        names.append(threading.current_thread().name)
        started.wait(10)
        release.wait(10)

    for _ in range(8):
        cache.run(blocked)
    started.wait(10)  # a call queued behind a blocked one would break the barrier
    release.set()
    first = {t for t in threading.enumerate() if t.name == "test-cache"}
    assert len(first) == 8

    done = threading.Event()
    ran_on: list[threading.Thread] = []
    while cache._idle < 8:
        threading.Event().wait(0.01)  # the eight finish and wait for more
    cache.run(lambda: (ran_on.append(threading.current_thread()), done.set()))
    assert done.wait(10)
    assert ran_on[0] in first  # an idle thread took it: none was started
    assert {t for t in threading.enumerate() if t.name == "test-cache"} == first


def test_an_idle_thread_ends_after_idle_s():
    cache = ThreadCache("test-cache-short", idle_s=0.05)
    done = threading.Event()
    cache.run(done.set)
    assert done.wait(10)
    pause = threading.Event()
    for _ in range(200):
        if not any(t.name == "test-cache-short" for t in threading.enumerate()):
            break
        pause.wait(0.01)
    assert not any(t.name == "test-cache-short" for t in threading.enumerate())
    assert cache._idle == 0
