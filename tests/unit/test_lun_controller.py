"""`powerdev luns`'s controller (dra/lun_controller.py) against a fake API
server, on Trio's virtual clock: what it does with a report's heartbeat,
and with a watch that keeps failing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import trio
import trio.testing

from powerdev.dra.lun_controller import Controller
from powerdev.dra.luns import NodeSeen, Sighting, report_body

LUN = Sighting("lun-0", "DM_UUID=mpath-3600a", 2, 1 << 30, "IBM", "2145")
TTL = 30.0


class FakeApi:
    """Reports as the API server lists them (each with its resourceVersion);
    a watch that yields what is put in `events`, or fails at once."""

    def __init__(self, *bodies: dict[str, Any], watch_fails: bool = False) -> None:
        self.bodies = {b["metadata"]["name"]: b for b in bodies}
        self.version = 100  # the list's resourceVersion: newer than every item's
        self.watch_fails = watch_fails
        self.watched_from: list[str | None] = []
        self.send, self.events = trio.open_memory_channel[tuple[str, dict[str, Any]]](10)
        self.slices: dict[str, dict[str, Any]] = {}
        self.applied = trio.Event()
        # every reporting node a Ready Node labelled with its own name
        self.nodes_seen = {b["data"]["node"]: NodeSeen(b["data"]["node"], True) for b in bodies}
        self.node_send, self.node_events = trio.open_memory_channel[tuple](10)

    async def reports(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        return list(self.bodies.values()), str(self.version)

    async def watch_reports(
        self, namespace: str, resource_version: str | None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if self.watch_fails:
            raise OSError("410 Gone: too old resource version")
        async for event in self.events:
            yield event

    async def nodes(self) -> tuple[dict[str, NodeSeen], str]:
        return dict(self.nodes_seen), "50"

    async def watch_nodes(self, resource_version: str | None) -> AsyncIterator[tuple]:
        async for event in self.node_events:
            yield event

    async def cluster_slices(self, driver: str, prefix: str) -> list[dict[str, Any]]:
        return list(self.slices.values())

    async def apply_slice(self, body: dict[str, Any]) -> None:
        self.slices[body["metadata"]["name"]] = body
        self.applied.set()
        self.applied = trio.Event()

    async def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)


def body(node: str, heartbeat: int, version: int, *luns: Sighting) -> dict[str, Any]:
    made = report_body("ns", node, "d", "r/lun", luns, heartbeat)
    made["metadata"]["resourceVersion"] = str(version)
    return made


def named(api: FakeApi) -> list[list[str]]:
    """The hostnames each device of the pool's one slice names."""
    (item,) = api.slices.values()
    return [
        d["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
        for d in item["spec"]["devices"]
    ]


async def until(api: FakeApi, predicate) -> None:
    while not (api.slices and predicate(named(api))):
        await api.applied.wait()


@contextlib.asynccontextmanager
async def leading(
    api: FakeApi, limit: float = 1.0
) -> AsyncIterator[tuple[Controller, trio.Nursery]]:
    """The controller leading over `api`, once it has published the LUN for
    nodes a and b (within `limit` seconds); cancelled on the way out."""
    controller = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(controller.run)
        with trio.fail_after(limit):
            await until(api, lambda nodes: nodes == [["a", "b"]])
        yield controller, nursery
        nursery.cancel_scope.cancel()


async def test_a_silent_node_leaves_after_the_ttl_even_when_the_watch_keeps_failing(
    autojump_clock,
):
    """Every failed watch lists the reports again: a report listed again
    unchanged (its resourceVersion the same) is no heartbeat, so a node
    whose powerdev was killed still leaves after the ttl."""
    api = FakeApi(body("a", 1, 5, LUN), body("b", 1, 6, LUN), watch_fails=True)
    async with leading(api) as (_, nursery):
        began = trio.current_time()
        nursery.start_soon(beat, api, "b")  # b's heartbeat goes on; a's stopped
        with trio.fail_after(TTL * 3):
            await until(api, lambda nodes: nodes == [["b"]])
        assert trio.current_time() - began >= TTL - 1


async def beat(api: FakeApi, node: str) -> None:
    """The node's powerdev writing its report again every 5 s (virtual)."""
    for heartbeat in range(2, 1000):
        await trio.sleep(5)
        api.version += 1
        api.bodies[node] = body(node, heartbeat, api.version, LUN)


async def test_the_watch_starts_from_the_lists_version_and_a_heartbeat_merges_nothing(
    autojump_clock,
):
    """The watch starts where the list was taken (not at the newest report,
    which may be older than what etcd keeps); a report whose LUNs did not
    change (only its heartbeat) keeps its node alive without a merge of
    every report; a change is merged and published."""
    api = FakeApi(body("a", 1, 5, LUN), body("b", 1, 6, LUN))
    async with leading(api) as (controller, _):
        passes = controller.passes
        for heartbeat in range(2, 12):  # ten heartbeats of b, over a quarter of the ttl
            await api.send.send(("MODIFIED", body("b", heartbeat, 100 + heartbeat, LUN)))
            await trio.sleep(TTL / 40)  # virtual time: b's heartbeat goes on
        assert controller.passes == passes
        await api.send.send(("MODIFIED", body("b", 12, 112)))  # b lost the LUN
        with trio.fail_after(1):
            await until(api, lambda nodes: nodes == [["a"]])
        assert api.watched_from == ["100"]  # one watch, from the list's version


async def test_a_node_that_goes_not_ready_leaves_every_selection_at_once_and_comes_back(
    autojump_clock,
):
    """Its powerdev still reports (the API server reaches it, its kubelet is
    gone): the Node's Ready condition alone takes it out, and back in;
    a Node deleted leaves too. A Node's change that is no change of its
    label or readiness (a status heartbeat) publishes nothing."""
    api = FakeApi(body("a", 1, 5, LUN), body("b", 1, 6, LUN))
    async with leading(api) as (controller, _):
        with trio.fail_after(1):
            began = trio.current_time()
            await api.node_send.send(("MODIFIED", "a", NodeSeen("a", False), "51"))
            await until(api, lambda nodes: nodes == [["b"]])
            assert trio.current_time() == began  # at once, no ttl waited for
            writes, passes = controller.writes, controller.passes
            await api.node_send.send(("MODIFIED", "b", NodeSeen("b", True), "52"))
            await api.node_send.send(("MODIFIED", "a", NodeSeen("a", True), "53"))
            await until(api, lambda nodes: nodes == [["a", "b"]])
            assert controller.writes == writes + 1  # b's heartbeat wrote nothing
            assert controller.passes == passes + 1
            await api.node_send.send(("DELETED", "b", NodeSeen("b", True), "54"))
            await until(api, lambda nodes: nodes == [["a"]])


def many(count: int) -> list[Sighting]:
    return [Sighting(f"lun-{i:03d}", f"DM_UUID=mpath-{i:03d}", 2, 1 << 30) for i in range(count)]


def generations(api: FakeApi) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in api.slices.values()}


async def settled(controller: Controller) -> None:
    """Until the controller has merged what it was sent, and waits again
    (every task blocked: on the real clock, no ttl comes meanwhile)."""
    await trio.testing.wait_all_tasks_blocked()


async def test_a_change_to_one_lun_is_one_slice_written_at_the_same_generation():
    """300 LUNs are three slices. A LUN that node a loses changes its slice
    alone: that slice is written, at the same generation (the pool stays
    whole). A LUN that comes goes where there is room: one write again. A
    new leader finds the pool right and writes nothing; a slice of an
    older generation that a leader left goes at the next change."""
    luns = many(300)
    api = FakeApi(body("a", 1, 5, *luns), body("b", 1, 6, *luns))
    controller = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            await settled(controller)
            assert len(api.slices) == 3 and generations(api) == {1}
            writes = controller.writes
            await api.send.send(("MODIFIED", body("a", 2, 101, *luns[1:])))  # a lost lun-000
            await settled(controller)
            assert controller.writes == writes + 1 and generations(api) == {1}
            assert api.slices[min(api.slices)]["spec"]["devices"][0]["name"] == "lun-000"
            writes = controller.writes
            more = [*luns, Sighting("lun-new", "DM_UUID=mpath-new", 2, 1 << 30)]
            await api.send.send(("MODIFIED", body("b", 2, 102, *more)))
            await settled(controller)
            assert controller.writes == writes + 1 and generations(api) == {1}
            nursery.cancel_scope.cancel()
        api.version = 200
        api.bodies = {"a": body("a", 2, 101, *luns[1:]), "b": body("b", 2, 102, *more)}
        leftover = {**next(iter(api.slices.values()))}
        leftover["metadata"] = {"name": "d-left-over-7"}
        leftover["spec"] = {
            **leftover["spec"],
            "pool": {**leftover["spec"]["pool"], "generation": 0},
        }
        api.slices["d-left-over-7"] = leftover
        again = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(again.run)
            await settled(again)
            assert again.writes == 1  # the left-over deleted, nothing written
            assert "d-left-over-7" not in api.slices and len(api.slices) == 3
            nursery.cancel_scope.cancel()


async def test_a_new_leader_completes_a_pool_its_predecessor_left_short():
    """A leader that stopped within a new generation left slices that name
    more slices than there are: the pool is incomplete, and the scheduler
    allocates nothing from it. A new leader whose devices fit the slices
    found still writes a new generation on every slice, with their true
    count, rather than finding nothing to change."""
    luns = many(200)
    api = FakeApi(body("a", 1, 5, *luns))
    first = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.run)
            await settled(first)
            nursery.cancel_scope.cancel()
        assert len(api.slices) == 2 and generations(api) == {1}
        for item in api.slices.values():
            item["spec"]["pool"].update(generation=5, resourceSliceCount=3)
        again = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(again.run)
            await settled(again)
            nursery.cancel_scope.cancel()
    assert generations(api) == {6} and again.writes == 2
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()} == {2}


class Refusing(FakeApi):
    """Refuses the Node list a first time (a role from before the Node
    watch: 403), then a cluster pool list and a slice write once each."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        super().__init__(*bodies)
        self.refusals = {"nodes": 1, "cluster_slices": 1, "apply_slice": 0}

    def _refuse(self, call: str) -> None:
        if self.refusals[call]:
            self.refusals[call] -= 1
            raise OSError(f"403 Forbidden: {call}")

    async def nodes(self) -> tuple[dict[str, NodeSeen], str]:
        self._refuse("nodes")
        return await super().nodes()

    async def cluster_slices(self, driver: str, prefix: str) -> list[dict[str, Any]]:
        self._refuse("cluster_slices")
        return await super().cluster_slices(driver, prefix)

    async def apply_slice(self, body: dict[str, Any]) -> None:
        self._refuse("apply_slice")
        await super().apply_slice(body)


async def test_a_leader_that_cannot_read_the_nodes_or_the_pool_tries_again_and_never_exits(
    autojump_clock,
):
    """At takeover the Node list and the pool's list are refused once each:
    the controller says so and tries again, rather than ending (the Lease
    would then go round the replicas, none publishing). A slice write that
    fails, and the pool's list after it that fails too, are tried again."""
    api = Refusing(body("a", 1, 5, LUN), body("b", 1, 6, LUN))
    async with leading(api, limit=60):
        api.refusals.update(apply_slice=1, cluster_slices=1)
        await api.send.send(("MODIFIED", body("b", 2, 101)))  # b lost the LUN
        with trio.fail_after(60):
            await until(api, lambda nodes: nodes == [["a"]])
        assert api.refusals == {"nodes": 0, "cluster_slices": 0, "apply_slice": 0}


class OneRefused(FakeApi):
    """Refuses every write of one resource's pool (an admission policy, a
    validation error); the other resource's pool is taken."""

    lists = 0

    async def apply_slice(self, body: dict[str, Any]) -> None:
        if "r/bad" in body["spec"]["pool"]["name"]:
            raise OSError("422 Unprocessable Entity")
        await super().apply_slice(body)

    async def cluster_slices(self, driver: str, prefix: str) -> list[dict[str, Any]]:
        self.lists += 1
        return await super().cluster_slices(driver, prefix)


async def test_a_pool_that_is_always_refused_is_tried_again_ever_more_slowly(autojump_clock):
    """One resource's pool is refused at every write, another's is taken: the
    pause between passes grows (0.1 s doubling to 10 s) although the other
    pool succeeds, instead of a pass and a list of every slice five times
    a second."""
    refused = report_body("ns", "a", "d", "r/bad", [LUN], 1)
    taken = report_body("ns", "b", "d", "r/good", [LUN], 1)
    for version, made in enumerate((refused, taken), start=5):
        made["metadata"]["resourceVersion"] = str(version)
    api = OneRefused(refused, taken)
    controller = Controller(api, "ns", "d", TTL)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(controller.run)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert controller.passes <= 15 and api.lists <= 16  # 0.1 + 0.2 + ... then 10 s a pass
    assert any("r/good" in s["spec"]["pool"]["name"] for s in api.slices.values())
