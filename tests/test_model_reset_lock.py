"""MemoryStore.reset() takes the store's own lock: it never runs while another thread is inside a store method.

The other thread is held inside a store method deterministically (its clock blocks until released), so the
assertion that reset has not finished cannot fail on a correct store whatever the machine's speed; the
join timeout only bounds how long a broken store gets to show that it did not wait."""

from __future__ import annotations

import threading

from atmostonce import MemoryStore


def test_reset_waits_for_a_store_method_running_in_another_thread():
    inside, release = threading.Event(), threading.Event()
    blocking = threading.local()

    def clock() -> float:
        if getattr(blocking, "on", False):
            inside.set()  # called under the store's lock
            assert release.wait(30)
        return 1000.0

    store = MemoryStore(clock=clock)
    store.submit("acct", "post", "room-1", {"text": "before reset"})

    def hold_the_lock() -> None:
        blocking.on = True
        store.kill_switch_engaged("acct")  # reads the clock with the store's lock held

    holder = threading.Thread(target=hold_the_lock, daemon=True)
    resetter = threading.Thread(target=store.reset, daemon=True)
    holder.start()
    assert inside.wait(30)
    try:
        resetter.start()
        resetter.join(timeout=1.0)
        assert resetter.is_alive(), "reset ran while another thread held the store's lock"
    finally:
        release.set()
        holder.join(30)
        resetter.join(30)
    assert not holder.is_alive() and not resetter.is_alive()
    assert store.list_intents() == []
