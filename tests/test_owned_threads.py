"""Issue 37's threads: the synced state writer, the listener's encoder of bulky answers and the
local object store work on threads of their own, not asyncio's default executor (where
object-store transfers and admin work may hold every thread while a produce's answer waits for
its sync), one set per server object (two servers in one process share none), ended by its close.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from headwater.server.config import ServerConfig
from headwater.server.net.listener import Listener
from headwater.server.reply import encode_off_loop
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.state import StateStore, StateWriter
from headwater.wire import messages as m
from headwater.wire.errors import StorageError
from headwater.wire.frames import FrameHeader
from headwater.wire.protocol import REQUEST_API_KEYS


def _noting_thread(store: StateStore, seen: list[threading.Thread]) -> None:
    """Note the thread each synced write runs on."""
    write_all = store.write_all

    def noted(
        changes: Sequence[tuple[dict[bytes, bytes], list[bytes]]], sync: bool = False
    ) -> None:
        seen.append(threading.current_thread())
        write_all(changes, sync)

    store.write_all = noted  # type: ignore[method-assign]


async def test_each_state_writer_syncs_on_a_thread_of_its_own_and_ends_it(tmp_path: Path) -> None:
    # named, so a write on one of its threads shows
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(1, thread_name_prefix="asyncio-default")
    )
    stores = [StateStore(tmp_path / name) for name in ("a", "b")]
    writers = [StateWriter(store) for store in stores]
    seen: list[list[threading.Thread]] = [[], []]
    for store, threads in zip(stores, seen, strict=True):
        _noting_thread(store, threads)
    try:
        await asyncio.gather(*(w.synced({b"k": b"v"}) for w in writers))
        (first,), (second,) = seen
        assert first is not second  # two servers' writers share no thread
        assert first.name.startswith("hw-state") and second.name.startswith("hw-state")
        for writer in writers:
            await writer.close()
        assert not first.is_alive() and not second.is_alive()  # ended with its writer
        with pytest.raises(StorageError):
            await writers[0].synced({b"k": b"late"})
    finally:
        for store in stores:
            store.close()


async def test_each_listener_encodes_bulky_answers_on_a_thread_it_owns_and_ends(
    tmp_path: Path,
) -> None:
    listeners = [Listener(ServerConfig(data_dir=tmp_path / name)) for name in ("a", "b")]
    encoders = [listener.shared.encoder for listener in listeners]
    assert isinstance(encoders[0], ThreadPoolExecutor)
    assert encoders[0] is not encoders[1]  # two servers' listeners share no encoder
    header = FrameHeader(REQUEST_API_KEYS[m.ListTopicsRequest], 0, 7, 0)
    written: list[bytes] = []
    for encoder in encoders:
        await encode_off_loop(header, m.ListTopicsResponse(()), written.append, encoder)
    assert len(written) == 2
    for listener in listeners:
        listener.close()
    for encoder in encoders:
        with pytest.raises(RuntimeError):  # shut down with its listener
            encoder.submit(print)


async def test_each_local_object_store_works_on_threads_it_owns_and_ends(tmp_path: Path) -> None:
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(1, thread_name_prefix="asyncio-default")
    )
    stores = [LocalObjectStore(tmp_path / name) for name in ("a", "b")]
    seen: list[threading.Thread] = []
    for store in stores:
        put = store._put

        def noted(path: Path, data: bytes, exclusive: bool, put: Any = put) -> bool:
            seen.append(threading.current_thread())
            result: bool = put(path, data, exclusive)
            return result

        store._put = noted  # type: ignore[method-assign]
        await store.put("k", b"v")
    assert all(thread.name.startswith("hw-objects") for thread in seen)
    assert seen[0] is not seen[1]  # two servers' stores share no thread
    for store in stores:
        await store.close()
    assert not any(thread.is_alive() for thread in seen)
    with pytest.raises(StorageError):
        await stores[0].get("k")
