"""The repository's sample config (headwater.example.toml) and the safe defaults of issue 13."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import headwater
from headwater.server.config import ObjectStoreConfig, ServerConfig, TopicSettings
from headwater.server.config_file import load_config, with_overrides
from headwater.testing import ServerProcess

EXAMPLE = Path(__file__).resolve().parent.parent / "headwater.example.toml"


def test_example_config_loads_and_is_the_defaults() -> None:
    config = load_config(EXAMPLE)
    assert config == ServerConfig()  # a documented value that drifts from the default fails here


def test_example_config_paths_follow_data_dir(tmp_path: Path) -> None:
    config = with_overrides(load_config(EXAMPLE), data_dir=tmp_path / "elsewhere")
    assert config.data_dir == tmp_path / "elsewhere"
    # unset: the server puts the local object store at <data_dir>/objects (server/serve.py)
    assert config.object_store.path is None
    text = EXAMPLE.read_text()
    assert "./data/objects" not in text
    sample = (EXAMPLE.parent / "docs" / "CONFIGURATION.md").read_text().split("```toml")[1]
    assert "./data/objects" not in sample.split("```")[0]  # the documented sample TOML


def test_retention_defaults_bound_local_disk_but_never_without_an_object_store() -> None:
    defaults = ServerConfig().topic_defaults
    assert (defaults.retention_bytes, defaults.retention_ms) == (1024**3, 7 * 24 * 3600 * 1000)
    bare = ServerConfig(object_store=ObjectStoreConfig(backend="none"))
    assert (bare.topic_defaults.retention_bytes, bare.topic_defaults.retention_ms) == (-1, -1)
    explicit = ServerConfig(
        object_store=ObjectStoreConfig(backend="none"),
        topic_defaults=TopicSettings(retention_bytes=5000),
    )
    assert explicit.topic_defaults.retention_bytes == 5000  # set on purpose: it applies
    assert dataclasses.replace(bare).topic_defaults.retention_bytes == -1


async def test_a_new_reliable_topic_gets_the_retention_defaults(
    client: headwater.Client, topic_name: str, server: ServerProcess
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    configs = {c.name: c.value for c in (await client.describe_topic(topic_name)).topic.configs}
    assert configs["retention.bytes"] == str(1024**3)
    assert configs["retention.ms"] == str(7 * 24 * 3600 * 1000)
