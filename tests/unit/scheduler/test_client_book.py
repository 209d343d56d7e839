"""Per-client limits: a connection is the client, unless a request names its user."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.services.scheduler.clients import ClientBook


def test_requests_naming_a_user_count_against_that_user_not_their_connection():
    book = ClientBook(max_inflight=2)
    api = b"api-process"
    book.admit(api, "a1", True, "alice")
    book.admit(api, "a2", True, "alice")
    with pytest.raises(RequestRejected, match="user 'alice' already has 2"):
        book.admit(api, "a3", True, "alice")
    book.admit(api, "b1", True, "bob")  # the same connection, another user
    book.admit(b"api-process-2", "a4", True, "bob")  # and a user is one user across connections
    with pytest.raises(RequestRejected, match="user 'bob'"):
        book.admit(api, "b2", True, "bob")
    book.done("a1")
    book.admit(api, "a3", True, "alice")  # a finished request gives its slot back
    assert book.live[api] == {"a2", "a3", "b1"}  # the connection still routes all of them


def test_without_a_user_the_connection_is_the_client():
    book = ClientBook(max_inflight=1)
    book.admit(b"c", "r1", False)
    with pytest.raises(RequestRejected, match="this client already has 1"):
        book.admit(b"c", "r2", False)
