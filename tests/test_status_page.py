"""The status page in a real headless browser (Debian's chromium), against a live server with
traffic: its charts render with data, and a screenshot is kept as a test artifact.

The screenshot goes to the test's tmp dir and is copied to `test-artifacts/status-page.png` at
the repository root (or `$HEADWATER_TEST_ARTIFACTS`); that directory ignores itself in git.
`make test` installs chromium when it is missing; without it this test fails and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import pytest

import headwater
from tests.test_metrics import get, start_with_http

ROOT = Path(__file__).resolve().parent.parent
WINDOW = (1400, 1000)


def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium: install Debian's chromium (`make test` does it when it can)")


async def _chromium(browser: str, profile: Path, *args: str, wait: bool = True) -> bytes:
    """`wait`: run the page's first refreshes, in virtual time; without it chromium dumps or
    shoots the page as it is at the load event."""
    process = await asyncio.create_subprocess_exec(
        browser,
        "--headless",
        "--no-sandbox",  # needed as root and in containers
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        *(["--virtual-time-budget=4000"] if wait else []),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out


async def _traffic(address: str, stop: asyncio.Event) -> None:
    """Steady traffic: a reliable topic read by one subscription and ignored by another (its
    lag grows), and a non-reliable topic read as it comes."""
    async with await headwater.connect(address) as client:
        await client.create_topic("orders", partitions=2, dispatch="reliable")
        await client.create_topic("clicks", dispatch="non-reliable")
        audit = await client.subscribe("orders", "audit", start="earliest")
        # two subscriptions that never read: equal lag, two lines on top of each other
        await (await client.subscribe("orders", "reports", start="earliest")).close()
        await (await client.subscribe("orders", "reports2", start="earliest")).close()
        # a topic with a lagging subscription, deleted by the test once it is in the history
        await client.create_topic("gone", dispatch="reliable")
        await (await client.subscribe("gone", "old", start="earliest")).close()
        async with client.producer("gone") as gone:
            await gone.send(b"x")
        views = await client.subscribe("clicks", "views")
        orders, clicks = client.producer("orders"), client.producer("clicks")
        for step in range(1000):  # bounded: about 100 s at most
            if stop.is_set():
                break
            for i in range(40 + step % 20):  # clicks twice as fast: two distinct lines
                await orders.send(b"order %d" % i)
                await clicks.send(b"click %d" % i)
                await clicks.send(b"click %d" % i)
            await orders.flush()
            await clicks.flush()
            for batch in (audit, views):
                for message in await batch.receive_batch(1000, timeout=0.05):
                    await message.ack()
            await asyncio.sleep(0.1)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _keep(screenshot: Path) -> Path:
    artifacts = Path(os.environ.get("HEADWATER_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    ignore = artifacts / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    kept = artifacts / "status-page.png"
    shutil.copyfile(screenshot, kept)
    return kept


def _operations_recipe(url: str, screenshot: Path) -> list[str]:
    """docs/OPERATIONS.md's screenshot command, with this server's URL and this file."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    found = re.search(r"^(chromium --headless .*?)$", text, re.M)
    assert found is not None, "OPERATIONS.md has no `chromium --headless` screenshot recipe"
    line = found[1].replace("http://127.0.0.1:9650/", url)
    line = line.replace("--screenshot=status.png", f"--screenshot={screenshot}")
    assert "--virtual-time-budget=" in line and url in line and str(screenshot) in line, line
    return [_browser(), *line.split()[1:], f"--user-data-dir={screenshot.parent / 'shot'}"]


async def test_status_page_renders_charts_in_chromium(tmp_path: Path) -> None:
    browser = _browser()
    server, port = start_with_http(tmp_path)
    stop = asyncio.Event()
    traffic = asyncio.create_task(_traffic(server.address, stop))
    try:
        # Wait (bounded) until the ring holds a few samples with traffic in them: every 2 s.
        deadline = time.monotonic() + 30
        while True:
            assert not traffic.done() or traffic.exception() is None, traffic.exception()
            status, _, body = await asyncio.to_thread(get, port, "/status.json")
            assert status == 200
            history = json.loads(body)["history"]
            rates = [r for r in history["in_per_second"].get("orders", []) if r]
            lag = [v for v in history["lag"].get("orders/reports", []) if v]
            if len(rates) >= 3 and len(lag) >= 3 and history["lag"].get("gone/old"):
                break
            assert time.monotonic() < deadline, history
            await asyncio.sleep(0.5)
        async with await headwater.connect(server.address) as client:
            await client.delete_topic("gone")  # its lines leave the charts and legends at once
        _, _, body = await asyncio.to_thread(get, port, "/status.json")
        history = json.loads(body)["history"]
        assert "gone" not in history["in_per_second"] and "gone/old" not in history["lag"]

        url = f"http://127.0.0.1:{port}/"
        # as served, before any refresh: drawn at the load event, not "loading..." (issue 41)
        first = await _chromium(browser, tmp_path / "profile-first", "--dump-dom", url, wait=False)
        assert "data-rendered=" in first.decode() and "loading" not in first.decode()
        dom = (await _chromium(browser, tmp_path / "profile-dom", "--dump-dom", url)).decode()
        assert "data-rendered=" in dom, "the page's script never rendered a status"
        for page in (first.decode(), dom):
            assert 'data-name="gone' not in page and ">gone<" not in page  # deleted: no legend
            # the equal lag lines: different dashes, and the later one's legend names the other
            lines = r'stroke-dasharray="([^"]+)" class="series" data-name="(orders/reports2?)"'
            dashes = {name: dash for dash, name in re.findall(lines, page)}
            assert set(dashes) == {"orders/reports", "orders/reports2"}, page[:3000]
            assert dashes["orders/reports"] != dashes["orders/reports2"]
            assert 'data-name="orders/reports2" data-same-as="orders/reports"' in page
        charts = re.findall(r'<svg class="chart"[^>]*data-series="(\d+)" data-points="(\d+)"', dom)
        assert len(charts) == 3, dom[:2000]
        for series, points in charts:
            assert int(series) >= 1 and int(points) >= 3, charts
        assert dom.count('class="series"') >= 5  # in: 2 topics, out: 2, lag: 2 subscriptions
        for name in ("orders", "clicks", "audit", "reports"):
            assert f">{name}</td>" in dom, name
        assert '<span class="good">ready</span>' in dom
        assert '<div id="error"></div>' in dom  # no failed refresh

        # the recipe in docs/OPERATIONS.md, as written there
        screenshot = tmp_path / "status-page.png"
        recipe = _operations_recipe(url, screenshot)
        shot = await asyncio.create_subprocess_exec(
            *recipe, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        assert await asyncio.wait_for(shot.wait(), 90) == 0, recipe
        assert _png_size(screenshot) == WINDOW
        assert screenshot.stat().st_size > 20_000  # charts and tables, not a blank page
        kept = _keep(screenshot)
        print(f"status page screenshot: {kept}")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(traffic, 10)
        server.kill()


async def test_the_status_page_lists_the_kafka_groups(tmp_path: Path) -> None:
    """A classic group, a Kafka 4 consumer group (KIP-848) and a share group (KIP-932), each with
    a member polling, appear in /status.json's `kafka_groups` and in the page's table, rendered
    by chromium; a share group's records are its Shared subscription's row."""
    from confluent_kafka import Consumer, ShareConsumer

    browser = _browser()
    kafka_file = tmp_path / "kafka.port"
    server, port = start_with_http(
        tmp_path, ("--kafka-port", "0", "--kafka-port-file", str(kafka_file))
    )
    members: list[Consumer | ShareConsumer] = []
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("work", partitions=2, dispatch="reliable")
        bootstrap = f"127.0.0.1:{int(kafka_file.read_text())}"
        common = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
        members = [
            Consumer({**common, "group.id": "old-style"}),
            Consumer({**common, "group.id": "new-style", "group.protocol": "consumer"}),
            ShareConsumer({"bootstrap.servers": bootstrap, "group.id": "queue"}),
        ]
        for member in members:
            member.subscribe(["work"])
        wanted = {("old-style", "classic"), ("new-style", "consumer"), ("queue", "share")}
        deadline = time.monotonic() + 60
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            for member in members:
                await asyncio.to_thread(member.poll, 0.2)
            _, _, body = await asyncio.to_thread(get, port, "/status.json")
            rows = json.loads(body)["kafka_groups"]
            joined = {(r["name"], r["kind"]) for r in rows if r["members"] == 1}
            if wanted <= joined:
                break
        else:
            raise AssertionError(f"the groups never all showed a member: {rows}")
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})
        listed = await asyncio.to_thread(
            lambda: admin.list_consumer_groups(request_timeout=10).result()
        )
        # a stock admin client's consumer groups: not the share group, as from Kafka (share
        # groups are listed by type: tests/test_kafka_share_groups.py)
        assert {g.group_id for g in listed.valid} == {"old-style", "new-style"}
        by_name = {r["name"]: r for r in rows}
        assert by_name["queue"]["topics"] == ["work"] and by_name["new-style"]["topics"] == ["work"]
        dom = (
            await _chromium(
                browser, tmp_path / "profile", "--dump-dom", f"http://127.0.0.1:{port}/"
            )
        ).decode()
        for name, kind in wanted:
            assert f'<td class="text">{name}</td><td class="text">{kind}</td>' in dom, name
    finally:
        for member in members:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(member.close)
        server.kill()
