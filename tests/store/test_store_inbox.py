"""pipeline.store inbox: idempotent adds, unread counter always equal to the unread rows."""

import asyncio
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline.store import InboxItem, RecordStore


@pytest.fixture
async def store(tmp_path):
    s = await RecordStore(str(tmp_path / "inbox.db")).open()
    yield s
    await s.close()


def item(user, n, at=None):
    return InboxItem(user_id=user, delivery_id=f"n_{user}_{n}.inbox", title=f"t{n}", body=f"b{n}",
                     created_at=at or 1000.0 + n)  # fmt: skip


async def true_unread(store, user):
    async with store._db.execute(
        "SELECT count(*) FROM inbox WHERE user_id = ? AND read_at IS NULL", (user,)
    ) as cur:
        return (await cur.fetchone())[0]


async def test_add_is_idempotent_and_counts_new_rows(store):
    assert await store.add_inbox([item("u1", i) for i in range(5)]) == 5
    assert await store.add_inbox([item("u1", i) for i in range(3, 8)]) == 3  # 3 and 4 replayed
    assert await store.add_inbox([item("u1", 0), item("u1", 0)]) == 0
    assert await store.add_inbox([]) == 0
    items, unread = await store.inbox("u1")
    assert unread == 8 and len(items) == 8
    assert [i["delivery_id"] for i in items] == [f"n_u1_{n}.inbox" for n in range(7, -1, -1)]
    assert await store.inbox("nobody") == ([], 0)


async def test_mappings_are_accepted_too(store):
    n = await store.add_inbox([{"user_id": "u9", "delivery_id": "d1", "title": "hi", "body": "x"}])
    assert n == 1
    [got], unread = await store.inbox("u9")
    assert (got["title"], got["body"], got["read_at"], unread) == ("hi", "x", None, 1)
    assert got["created_at"] > 0


async def test_mark_read_some_then_all(store):
    await store.add_inbox([item("u1", i) for i in range(6)] + [item("u2", i) for i in range(2)])
    ids = [f"n_u1_{n}.inbox" for n in (1, 2)]
    assert await store.mark_read("u1", ids + ids, at=5.0) == 2
    assert await store.mark_read("u1", ids) == 0, "already read"
    assert await store.mark_read("u1", ["n_u2_0.inbox"]) == 0, "not this user's message"
    assert await store.mark_read("u1", []) == 0
    items, unread = await store.inbox("u1")
    assert unread == 4 == await true_unread(store, "u1")
    assert {i["delivery_id"]: i["read_at"] for i in items if i["read_at"]} == dict.fromkeys(ids, 5.0)
    assert await store.mark_read("u1") == 4
    assert await store.mark_read("u1") == 0
    assert (await store.inbox("u1"))[1] == 0
    assert (await store.inbox("u2"))[1] == 2


async def test_pagination_with_before(store):
    await store.add_inbox([item("u1", i) for i in range(23)])
    seen, before = [], None
    while True:
        page, unread = await store.inbox("u1", limit=5, before=before)
        if not page:
            break
        seen += page
        before = page[-1]["id"]
    assert unread == 23
    assert [i["delivery_id"] for i in seen] == [f"n_u1_{n}.inbox" for n in range(22, -1, -1)]


async def test_counter_follows_direct_deletes_and_unread_again(store):
    await store.add_inbox([item("u1", i) for i in range(4)])
    await store.mark_read("u1", ["n_u1_0.inbox"])
    await store._db.execute("DELETE FROM inbox WHERE delivery_id IN ('n_u1_0.inbox', 'n_u1_1.inbox')")
    assert (await store.inbox("u1"))[1] == 2 == await true_unread(store, "u1")
    await store.mark_read("u1")
    await store._db.execute("UPDATE inbox SET read_at = NULL WHERE delivery_id = 'n_u1_2.inbox'")
    assert (await store.inbox("u1"))[1] == 1 == await true_unread(store, "u1")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["a", "b"]), st.lists(st.integers(0, 9), max_size=6)),
        st.tuples(st.just("read"), st.sampled_from(["a", "b"]), st.lists(st.integers(0, 9), max_size=4)),
        st.tuples(st.just("read_all"), st.sampled_from(["a", "b"]), st.just([])),
    ),
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_unread_always_matches_a_model(operations):
    async def run(path):
        unread = {"a": set(), "b": set()}
        known = {"a": set(), "b": set()}
        async with RecordStore(path) as s:
            for op, user, ns in operations:
                if op == "add":
                    new = {n for n in ns if n not in known[user]}
                    assert await s.add_inbox([item(user, n) for n in ns]) == len(new)
                    known[user] |= new
                    unread[user] |= new
                elif op == "read":
                    want = unread[user] & set(ns)
                    got = await s.mark_read(user, [f"n_{user}_{n}.inbox" for n in ns])
                    assert got == len(want)
                    unread[user] -= want
                else:
                    assert await s.mark_read(user) == len(unread[user])
                    unread[user] = set()
                for u in ("a", "b"):
                    items, count = await s.inbox(u, limit=100)
                    assert count == len(unread[u]) == await true_unread(s, u)
                    assert {i["delivery_id"] for i in items if i["read_at"] is None} == {
                        f"n_{u}_{n}.inbox" for n in unread[u]
                    }

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(f"{tmp}/i.db"))


@pytest.mark.asyncio
async def test_opt_outs_count_only_the_new_ones(store):
    """``add_unsubscribes``: a replayed opt-out (same user, switch and ``at``), in a
    later batch or twice in one, is kept once and not counted again."""
    a = ("u1", "marketing", "email", "stream", 1.0, "")
    b = ("u1", "marketing", "sms", "link", 2.0, "shop")
    assert await store.add_unsubscribes([a, b, a]) == 2
    assert await store.add_unsubscribes([b, ("u2", "marketing", "email", "stream", 1.0, "")]) == 1
    assert await store.add_unsubscribes([]) == 0
    got = sorted((r["user_id"], r["channel"], r["source"], r["producer"]) for r in await store.unsubscribes())
    assert got == [("u1", "email", "stream", ""), ("u1", "sms", "link", "shop"), ("u2", "email", "stream", "")]
