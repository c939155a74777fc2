"""The settings both engine integrations share (chunkstore/integrations/settings.py), as a careless
operator would give them: every refusal names the key and the value, and a folder's path is
checked before anything opens (SGLang's and vLLM's own settings classes use this parser; their
tests run in the engines' environments)."""

from __future__ import annotations

import pytest

from chunkstore.disk import StoreSpec, check_folder
from chunkstore.integrations.settings import extra_dict, store_fields

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
                        ("/tmp/" + "x" * 5000, "at most 4095 bytes"), ("/tmp/" + "y" * 300, "at most 255 bytes"),
                        ("  ", "not empty"), (12, "text")]:
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
