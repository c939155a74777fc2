"""The server keeps the one namespace rule (chunkstore/disk/namespaces.py): a bad namespace in the
``X-Chunkstore-Namespace`` header or the ``user`` field is a 400 naming the field and the rule,
before anything is submitted; the management API refuses a namespace token whose namespace
breaks it. Real uvicorn, real engine and cache."""

from __future__ import annotations

import pytest

from chunkstore.api.security import TokenRing
from chunkstore.server.auth import NAMESPACE_HEADER

BODY = {"prompt": "namespaces", "max_tokens": 1}


def _bad_request(reply, param: str, says: str) -> str:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert "namespace" in error["message"] and says in error["message"], error
    assert len(error["message"]) < 600  # a 1 MB namespace is named cut short
    return error["message"]


@pytest.mark.parametrize("user, says", [("../..", "'/'"), ("x" * (1 << 20), "1048576 characters"),
                                        ("a\u0000b", "control character"), (".", "'.' and '..'"),
                                        ("u" * 257, "257 characters")])
def test_a_bad_user_namespace_is_a_400_naming_the_rule(served, user, says):
    reply = served.client.post("/v1/completions", json={**BODY, "user": user})
    _bad_request(reply, "user", says)


def test_a_lone_surrogate_in_user_is_a_400(served):
    reply = served.client.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 1, "user": "\\ud800"}',
                               headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "user"


@pytest.mark.parametrize("header, says", [("../..", "'/'"), ("..", "'.' and '..'"), ("team/a", "'/'"),
                                          ("h" * 300, "300 characters")])
def test_a_bad_namespace_header_is_a_400_naming_it(served, header, says):
    reply = served.client.post("/v1/completions", json=BODY, headers={NAMESPACE_HEADER: header})
    _bad_request(reply, NAMESPACE_HEADER, says)


def test_good_namespaces_are_served(served):
    reply = served.client.post("/v1/completions", json=BODY, headers={NAMESPACE_HEADER: "tenant-a.1"})
    assert reply.status_code == 200, reply.text
    reply = served.client.post("/v1/completions", json={**BODY, "user": "tenant-é"})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("namespace", ["../..", "a\0b", "", "x" * 300])
def test_the_management_api_refuses_a_token_for_a_namespace_that_cannot_be_one(namespace):
    with pytest.raises(ValueError, match="namespace token's namespace cannot be one: namespace "):
        TokenRing("admin-token", [(namespace, "a-token")])
    with pytest.raises(ValueError, match="namespace token's namespace cannot be one"):
        TokenRing("admin-token", [], [(namespace, b"\0" * 32)])
