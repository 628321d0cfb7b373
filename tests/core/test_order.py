"""Which hop is outer: parent links first, then the hop order learned from links or declared,
else unordered; never the clocks."""

from __future__ import annotations

from hopmeter.core.order import MAX_LEARNED, HopOrder, Node, chains
from hopmeter.core.vocab import SegmentOrder


def links(nodes: list[Node], order: HopOrder | None = None) -> list[tuple[str, str, str]]:
    """(outer hop, inner hop, how) of every link, chain by chain."""
    return [
        (nodes[link.outer].hop, nodes[link.inner].hop, link.order)
        for c in chains(nodes, order)
        for link in c.links
    ]


def test_parent_links_make_the_chain_in_any_input_order() -> None:
    """Three flows each naming the one in front as its parent: one chain, outermost first."""
    nodes = [Node("origin", "o", "m"), Node("edge", "e", "client"), Node("mid", "m", "e")]
    (c,) = chains(nodes)
    assert [nodes[i].hop for i in c.members] == ["edge", "mid", "origin"]
    assert links(nodes) == [("edge", "mid", "link"), ("mid", "origin", "link")]


def test_unlinked_flows_are_ordered_by_what_is_known_else_unordered() -> None:
    """Two trees no link joins: declared order puts them in line, a learned one outranks it,
    and with neither they are neighbours of unknown order (listed by hop name)."""
    nodes = [Node("origin", "o", "proxy-span"), Node("edge", "e", None)]
    assert links(nodes) == [("edge", "origin", "unknown")]
    assert links(nodes, HopOrder(["edge", "origin"])) == [("edge", "origin", "declared")]
    taught = HopOrder(["origin", "edge"])
    taught.learn("edge", "origin")
    assert links(nodes, taught) == [("edge", "origin", "learned")]


def test_learned_order_is_transitive_and_only_when_consistent() -> None:
    """edge > mid and mid > origin make edge > origin; hops linked both ways are of no order."""
    order = HopOrder()
    order.learn("edge", "mid")
    order.learn("mid", "origin")
    assert order.outer_of("edge", "origin") == (True, SegmentOrder.LEARNED)
    assert order.outer_of("origin", "edge") == (False, SegmentOrder.LEARNED)
    order.learn("origin", "mid")  # a topology that puts them the other way round too
    assert order.outer_of("mid", "origin") is None
    assert order.outer_of("edge", "edge") is None


def test_the_learned_table_is_bounded() -> None:
    """Past MAX_LEARNED pairs nothing new is learned; what was learned stays."""
    order = HopOrder()
    order.learn("edge", "origin")
    for i in range(MAX_LEARNED + 10):
        order.learn(f"a{i}", f"b{i}")
    assert len(order.learned()) == MAX_LEARNED
    assert order.outer_of("edge", "origin") == (True, SegmentOrder.LEARNED)


def test_learn_links_takes_only_parent_links() -> None:
    """Learning from a trace's flows takes the links their spans make, never an order guessed
    between unlinked flows."""
    order = HopOrder()
    order.learn_links([Node("origin", "o", None), Node("edge", "e", None)])
    assert order.learned() == {}
    order.learn_links([Node("origin", "o", "e"), Node("edge", "e", None)])
    assert order.learned() == {("edge", "origin"): 1}


def test_a_trace_of_several_requests_is_never_stitched() -> None:
    """Flows of one trace with a hop seen twice and no links (two calls behind a proxy that adds
    its own spans): no link is guessed between them."""
    nodes = [Node("edge", "e1", None), Node("edge", "e2", None), Node("origin", "o1", "x")]
    assert links(nodes, HopOrder(["edge", "origin"])) == []
    assert len(chains(nodes)) == 3


def test_a_cycle_of_absurd_ids_is_cut() -> None:
    """Two spans naming each other as parent: one link, no endless walk."""
    nodes = [Node("a", "1", "2"), Node("b", "2", "1")]
    assert len(links(nodes)) == 1


def test_trees_are_joined_only_where_their_meeting_hops_are_in_known_order() -> None:
    """A linked pair edge > origin and a lone mid span of the same trace, with mid known to sit
    between them: the origin is not put in front of mid; the meeting is unordered."""
    order = HopOrder(["edge", "mid", "origin"])
    nodes = [Node("edge", "e", None), Node("origin", "o", "e"), Node("mid", "m", "proxy")]
    assert links(nodes, order) == [("edge", "origin", "link"), ("origin", "mid", "unknown")]
