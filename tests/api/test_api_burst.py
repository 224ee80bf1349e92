"""A burst of producers gets answers, not 503s (issue 26, item 3): 2,000 concurrent
POST /v1/events against the API on a real server; the API's broker connections
come from a bounded pool, so every request waits for one instead of opening its
own. No 5xx, no dropped connection; each answer 202 (or 429 with Retry-After)."""

import asyncio
from collections import Counter

import aiohttp


async def test_two_thousand_concurrent_posts_get_answers(api):
    headers = {"Authorization": f"Bearer {api.keys['events']}"}

    async def post(http: aiohttp.ClientSession, i: int) -> int:
        ev = {"biz_key": f"burst:{i}", "category": "otp", "template": "otp", "recipients": [f"b{i}"],
              "params": {"code": "123456"}}
        async with http.post(api.url + "/v1/events", json=ev, headers=headers) as r:
            if r.status == 429:
                assert r.headers.get("Retry-After")
            return r.status

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        statuses = Counter(await asyncio.gather(*(post(http, i) for i in range(2000))))
    assert set(statuses) <= {202, 429}, statuses
    assert statuses[202] >= 1000, statuses
