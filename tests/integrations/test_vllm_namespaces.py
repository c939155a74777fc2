"""The vLLM connector's namespaces keep the one namespace rule (chunkstore/disk/namespaces.py):
any ``cache_salt`` (a path, a megabyte, a NUL, a lone surrogate) makes a namespace that the store
takes, two salts never one namespace, and working it out never fails in vLLM's scheduler.
Run in the vLLM environment (scripts/vllm_env.sh); skipped where vLLM is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from chunkstore.disk.keys import DEFAULT_NAMESPACE  # noqa: E402
from chunkstore.disk.namespaces import check_namespace  # noqa: E402
from chunkstore.integrations.vllm import ConnectorSettings, namespace_for  # noqa: E402

SALTS = ["", "tenant-a", "../..", "x" * (1 << 20), "a\0b", "\ud800", "\ud800x", "\udfff"]


def test_every_salt_makes_a_namespace_that_keeps_the_rule():
    namespaces = [namespace_for(salt) for salt in SALTS]
    assert all(check_namespace(ns) == ns and ns.startswith("salt-") for ns in namespaces)
    assert len(set(namespaces)) == len(SALTS)
    assert namespace_for(None) == DEFAULT_NAMESPACE


def test_the_connectors_own_settings_name_the_key_and_the_value():
    with pytest.raises(ValueError, match=r"^kv_connector_extra_config 'device_size': not a size: '12XB'.*"
                                         r"\(got '12XB'\)"):
        ConnectorSettings.from_extra_config({"device_size": "12XB"})
    with pytest.raises(ValueError, match=r"^kv_connector_extra_config 'async_load': must be true or false "
                                         r"\(got 'yes'\)"):
        ConnectorSettings.from_extra_config({"async_load": "yes"})
    with pytest.raises(ValueError, match="'namespace'"):  # vLLM's namespaces come from cache_salt only
        ConnectorSettings.from_extra_config({"namespace": "a"})
