"""Autorecovery's settings for its HTTP status server, and what its health says, in this process
with the memory metadata store."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.process import AutorecoveryProcess
from bookie.autorecovery.worker import Autorecovery
from magnetar.common.config import load_config, missing_field_docs
from magnetar.common.errors import InvalidConfigError
from metadata import open_store


def test_http_settings_default_and_validate() -> None:
    config = AutorecoveryConfig()
    assert (config.http_port, config.bind_host) == (8001, "0.0.0.0")
    assert AutorecoveryConfig(http_port=0).http_port == 0  # any free port
    assert AutorecoveryConfig(http_port=65535).http_port == 65535
    for bad in (-1, 65536):
        with pytest.raises(InvalidConfigError, match="http_port") as e:
            AutorecoveryConfig(http_port=bad)
        assert "from 0 to 65535" in e.value.message
    assert missing_field_docs(AutorecoveryConfig) == []
    loaded = load_config(
        AutorecoveryConfig, env={"MAGNETAR_HTTP_PORT": "9101", "MAGNETAR_BIND_HOST": "127.0.0.1"}
    )
    assert (loaded.http_port, loaded.bind_host) == (9101, "127.0.0.1")


async def test_health_follows_the_instance_from_start_to_stop() -> None:
    store = await open_store("memory://")
    try:
        instance = Autorecovery(store, AutorecoveryConfig(check_interval_s=0.1))
        assert instance.health() == (False, "starting")
        await instance.start()
        await instance.active.wait()
        assert instance.health() == (True, "active")
        assert instance.is_active
        standby = await Autorecovery(
            store, AutorecoveryConfig(name="other", check_interval_s=0.1)
        ).start()
        try:
            async with asyncio.timeout(5):
                while (state := standby.health()) != (True, "standby"):
                    # before its session is granted: unready, saying so
                    assert state == (False, "no metadata session: connecting to the metadata store")
                    await asyncio.sleep(0.01)
            assert instance.health() == (True, "active")
        finally:
            await standby.close()
        await instance.close()
        assert instance.health() == (False, "stopping")
        assert not instance.is_active
    finally:
        await store.close()


async def test_a_taken_http_port_fails_the_start_naming_the_flag() -> None:
    store = await open_store("memory://")
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = AutorecoveryConfig(http_port=port, bind_host="127.0.0.1")
        with pytest.raises(InvalidConfigError, match="--http-port") as e:
            await AutorecoveryProcess.start(config, store=store)
        assert f"cannot listen on 127.0.0.1:{port}" in e.value.message
        # nothing was left running: the election is free for the next instance
        assert await store.get("/magnetar/autorecovery/leader") is None
    finally:
        taken.close()
        await store.close()
