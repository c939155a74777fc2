"""The settings both engine integrations share (chunkstore/integrations/settings.py), as a careless
operator would give them: every refusal names the key and the value, and a folder's path is
checked before anything opens (SGLang's and vLLM's own settings classes use this parser; their
tests run in the engines' environments)."""

from __future__ import annotations

import os

import pytest

from chunkstore.disk import StoreSpec, check_folder
from chunkstore.disk.namespaces import check_namespace
from chunkstore.integrations.settings import extra_dict, parsed, store_fields

WHERE = "kv_connector_extra_config"


@pytest.mark.parametrize("key, value, says", [
    ("disk_size", "500XB", "not a size"),
    ("max_pending", "-1GB", "size"),
    ("local_cache_size", "lots", "size"),
    ("disk_size", ["1GB"], ""),
    ("compression", "lz4", "zstd"),
    ("durability", "sometimes", "fsync"),
    ("background_priority", "urgent", "idle"),
    ("index_url", "mysql://db/kv", "postgresql"),
    ("object_store", "/data/kv", "s3://"),
])
def test_a_bad_value_is_refused_naming_its_key_and_the_value(key, value, says):
    with pytest.raises(ValueError) as caught:
        store_fields({key: value}, WHERE)
    message = str(caught.value)
    assert message.startswith(f"{WHERE} {key!r}: ") and says in message
    assert repr(value)[:20] in message


def test_a_disk_path_that_cannot_be_a_folder_is_refused_by_name(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for value, says in [(str(a_file), "is a file, not a folder"), ("/tmp/a\0b", "NUL"),
                        ("/tmp/" + "x" * 5000, "at most 4095 bytes"), ("/tmp/" + "z" * (1 << 20), "at most 4095 bytes"),
                        ("/tmp/" + "y" * 300, "at most 255 bytes"), ("  ", "not empty"), (12, "text"),
                        (str(a_file / "kv"), "cannot be made: .*a-file is a file, not a folder")]:
        with pytest.raises(ValueError, match=f"^{WHERE} 'disk_path': .*{says}"):
            store_fields({"disk_path": value}, WHERE)
    assert store_fields({"disk_path": "~/kv"}, WHERE)["disk_path"] == check_folder("~/kv")  # ~ expanded
    with pytest.raises(ValueError, match="is a file, not a folder"):
        StoreSpec(a_file)  # the door checks its folder too


def test_an_extra_config_that_is_not_an_object_is_refused_by_name():
    assert extra_dict(None, WHERE) == {}
    assert extra_dict({"disk_size": "1GB"}, WHERE) == {"disk_size": "1GB"}
    for value in (["disk_path", "/x"], "disk_path=/x", 3):
        with pytest.raises(ValueError, match=f"^{WHERE} must be a JSON object of chunkstore settings, got a "):
            extra_dict(value, WHERE)


def test_a_disk_path_that_does_not_exist_yet_is_checked_without_being_made(tmp_path):
    folder = tmp_path / "new" / "kv"
    assert store_fields({"disk_path": str(folder)}, WHERE)["disk_path"] == folder
    assert not (tmp_path / "new").exists()  # checking makes nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root may create folders anywhere")
def test_a_disk_path_in_a_folder_this_process_may_not_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ValueError, match=f"^{WHERE} 'disk_path': .*cannot be made: no permission"):
            store_fields({"disk_path": str(locked / "kv")}, WHERE)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("value, says", [("../..", "'/'"), ("x" * (1 << 20), "1048576 characters"),
                                         ("a\0b", "control character"), ("\ud800", "lone surrogate"),
                                         ("", "empty"), (7, "text")])
def test_a_namespace_setting_is_refused_naming_the_key_the_value_and_the_rule(value, says):
    """As SGLang's ``namespace`` key is checked (tests/integrations/test_sglang.py does it there)."""
    with pytest.raises(ValueError) as caught:
        parsed(WHERE, "namespace", check_namespace, value)
    message = str(caught.value)
    assert message.startswith(f"{WHERE} 'namespace': namespace ") and says in message
    assert "1-256 characters" in message or says == "text"
    assert len(message) < 600  # a 1 MB value is cut short, never printed whole
