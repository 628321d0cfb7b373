"""Which hop of a pair is the outer one: from the span tree, never from a clock.

hopmeter forwards `traceparent` with its own span id as the parent (W3C Trace Context), so the
inner hop's flow names the outer hop's flow as its parent: a segment's direction is that link,
whatever the two hosts' clocks say. Where no link joins two flows of one request (a proxy between
them adds a span of its own, or a gateway drops the trace and the flows were paired by their
reply), the order of their hops is taken from what is known of those hops: the order learned
from linked pairs of the same two hops, else the order declared (the listeners' order in one
process, `hopmeter join --order`). When none of these says, the pair is unordered: reported, with
a `segment_unordered` finding, and its holds are not observed (a guess from two clocks could turn
every hold around).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hopmeter.core.vocab import SegmentOrder

# Hop pairs remembered from links. Hop names are few (a fleet's tiers); past the bound nothing
# new is learned (what was learned stays), so a sender of absurd hop names cannot grow it.
MAX_LEARNED = 1024


class HopOrder:
    """What is known of the order of hops: declared (outermost first) and learned from links."""

    def __init__(self, declared: Sequence[str] = ()) -> None:
        self.declared: dict[str, int] = {}
        self.declare(declared)
        self._seen: dict[tuple[str, str], int] = {}  # (outer, inner) -> times linked so

    def declare(self, hops: Sequence[str]) -> None:
        """Declare the hops' order, outermost first (replacing an earlier declaration)."""
        self.declared = {}
        for hop in hops:
            self.declared.setdefault(hop, len(self.declared))

    def learn(self, outer: str, inner: str) -> None:
        """A link showed `outer` in front of `inner`."""
        key = (outer, inner)
        if outer == inner or (key not in self._seen and len(self._seen) >= MAX_LEARNED):
            return
        self._seen[key] = self._seen.get(key, 0) + 1

    def learn_links(self, nodes: Sequence[Node]) -> None:
        """Learn from the parent links among the flows of one trace."""
        for c in chains(nodes):
            for link in c.links:
                if link.order == SegmentOrder.LINK:
                    self.learn(nodes[link.outer].hop, nodes[link.inner].hop)

    def learned(self) -> dict[tuple[str, str], int]:
        """The pairs learned so far, (outer, inner) -> how many links showed them."""
        return dict(self._seen)

    def outer_of(self, a: str, b: str) -> tuple[bool, SegmentOrder] | None:
        """(whether `a` is outer of `b`, how that is known), or None when nothing says."""
        if a == b:
            return None
        if self._learned_path(a, b):
            return True, SegmentOrder.LEARNED
        if self._learned_path(b, a):
            return False, SegmentOrder.LEARNED
        ia, ib = self.declared.get(a), self.declared.get(b)
        if ia is not None and ib is not None:
            return ia < ib, SegmentOrder.DECLARED
        return None

    def _consistent(self, outer: str, inner: str) -> bool:
        """Links showed `outer` in front of `inner`, and never the other way round."""
        return (outer, inner) in self._seen and (inner, outer) not in self._seen

    def _learned_path(self, a: str, b: str) -> bool:
        """Whether consistent learned pairs lead from `a` to `b` (edge > mid, mid > origin:
        edge > origin). A table of MAX_LEARNED pairs at most: the walk is bounded by it."""
        if not self._seen:
            return False
        if self._consistent(a, b):
            return True
        todo, seen = deque([a]), {a}
        while todo:
            x = todo.popleft()
            for outer, inner in self._seen:
                if outer == x and inner not in seen and self._consistent(outer, inner):
                    if inner == b:
                        return True
                    seen.add(inner)
                    todo.append(inner)
        return False


@dataclass(frozen=True, slots=True)
class Node:
    """What ordering needs of one flow: its hop, its span and its parent's (falsy: none)."""

    hop: str
    span_id: Hashable
    parent_span_id: Hashable


@dataclass(frozen=True, slots=True)
class Link:
    """Two neighbouring flows of one request: `outer` in front of `inner` (indexes), and how
    that is known; UNKNOWN: no order is known (the two are listed by hop name)."""

    outer: int
    inner: int
    order: SegmentOrder


@dataclass(frozen=True, slots=True)
class Chain:
    """Flows joined by links: `head` carries the segments (the outermost, as far as known),
    `members` outermost first, `links` in the same order."""

    head: int
    members: tuple[int, ...]
    links: tuple[Link, ...]


def chains(nodes: Sequence[Node], order: HopOrder | None = None) -> list[Chain]:
    """The flows of one trace (or one request paired by content) as chains of links.

    Parent links first. Flows left in separate trees are one request only when no hop repeats
    among them (a trace shared by several requests at once, which instrumented clients make, is
    never stitched together); such trees are put in order by their hops (`order`), or listed as
    unordered neighbours.
    """
    parent = _parents(nodes)
    links = [Link(p, i, SegmentOrder.LINK) for i, p in enumerate(parent) if p is not None]
    roots = [i for i, p in enumerate(parent) if p is None]
    hops = [n.hop for n in nodes]
    if len(roots) > 1 and len(set(hops)) == len(hops):
        links += _between_trees(roots, parent, hops, order or HopOrder())
    return _collect(len(nodes), links)


def _parents(nodes: Sequence[Node]) -> list[int | None]:
    """Each flow's parent among `nodes` (None: a root); a cycle of absurd ids is cut."""
    index: dict[Hashable, int] = {}
    for i, n in enumerate(nodes):
        if n.span_id:
            index.setdefault(n.span_id, i)
    parent: list[int | None] = []
    for i, n in enumerate(nodes):
        p = index.get(n.parent_span_id) if n.parent_span_id else None
        parent.append(None if p == i else p)
    state = [0] * len(nodes)  # 0: not walked, 1: on the current walk, 2: done
    for i in range(len(nodes)):  # each flow is walked once: linear in the flows
        path = []
        j: int | None = i
        while j is not None and state[j] == 0:
            state[j] = 1
            path.append(j)
            j = parent[j]
        if j is not None and state[j] == 1:  # the walk met itself: cut the link that closed it
            parent[path[-1]] = None
        for k in path:
            state[k] = 2
    return parent


def _depths(parent: Sequence[int | None]) -> tuple[list[int], list[int]]:
    """Each flow's depth below its root, and its root (the parents have no cycle)."""
    depth: list[int] = [-1] * len(parent)
    root: list[int] = list(range(len(parent)))
    for i in range(len(parent)):
        path = []
        j: int | None = i
        while j is not None and depth[j] < 0:
            path.append(j)
            j = parent[j]
        d, r = (-1, path[-1]) if j is None else (depth[j], root[j])
        for k in reversed(path):
            d += 1
            depth[k], root[k] = d, r
    return depth, root


def _between_trees(
    roots: list[int], parent: Sequence[int | None], hops: Sequence[str], order: HopOrder
) -> list[Link]:
    """Links from each tree's innermost flow to the next tree's root, in the order of their
    hops where that is known; unordered neighbours where it is not."""
    depth, root = _depths(parent)
    deepest: dict[int, int] = {}  # root -> its deepest flow (the first one, at equal depth)
    for i, r in enumerate(root):
        if r not in deepest or depth[i] > depth[deepest[r]]:
            deepest[r] = i
    pending = sorted(roots, key=lambda r: hops[r])
    out: list[Link] = []
    last: int | None = None  # the tree put in order last
    while pending:
        first = next(
            (r for r in pending if all(_outer(order, hops[r], hops[o]) for o in pending if o != r)),
            None,
        )
        if first is None:  # nothing says which comes first: neighbours by hop name
            for r in pending:
                if last is not None:
                    out.append(Link(deepest[last], r, SegmentOrder.UNKNOWN))
                last = r
            break
        if last is not None:
            # the link is between the innermost flow of the tree before and this root: its own
            # two hops must be known in this order (a tree may hold hops of either side)
            known = order.outer_of(hops[deepest[last]], hops[first])
            how = known[1] if known is not None and known[0] else SegmentOrder.UNKNOWN
            out.append(Link(deepest[last], first, how))
        pending.remove(first)
        last = first
    return out


def _outer(order: HopOrder, a: str, b: str) -> bool:
    known = order.outer_of(a, b)
    return known is not None and known[0]


def _collect(n: int, links: list[Link]) -> list[Chain]:
    """Links grouped into chains, each from its head down (a flow's links in the order made)."""
    below: dict[int, list[Link]] = {}
    has_outer = set()
    for link in links:
        below.setdefault(link.outer, []).append(link)
        has_outer.add(link.inner)
    out = []
    for head in range(n):
        if head in has_outer:
            continue
        members, chain_links, todo, seen = [head], [], deque([head]), {head}
        while todo:
            for link in below.get(todo.popleft(), ()):
                if link.inner not in seen:
                    seen.add(link.inner)
                    members.append(link.inner)
                    chain_links.append(link)
                    todo.append(link.inner)
        out.append(Chain(head=head, members=tuple(members), links=tuple(chain_links)))
    return out
