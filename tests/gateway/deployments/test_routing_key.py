"""What a request's replica is chosen by: its namespace, or the namespace of the public segment it
shares with other tenants, so that they meet where its blocks are."""

from __future__ import annotations

from gateway.deployments.routing import routing_key
from tests.utils.envelopes import envelope, segment


def test_a_namespace_routes_by_itself_and_scope_none_by_nothing() -> None:
    a, b = envelope("tenant-a"), envelope("tenant-b")
    assert routing_key(a) == a.cache_namespace != routing_key(b)
    assert routing_key(envelope("tenant-a", scope="none")) is None


def test_tenants_given_the_same_segment_route_alike_by_its_longest_segment() -> None:
    short, long = segment(list(range(32))), segment(list(range(100, 164)))
    a, b = envelope("tenant-a", segments=(short, long)), envelope("tenant-b", segments=(long, short))
    assert routing_key(a) == routing_key(b) == next(s.namespace for s in a.public_segments if s.num_tokens == 64)
    assert routing_key(a) != a.cache_namespace
