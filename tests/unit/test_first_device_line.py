"""The first line of a resource's devices is made in a worker thread (at
10,000 devices putting the names in natural order takes 15 ms): what
changes meanwhile is logged after it, never before."""

from __future__ import annotations

import logging
import threading
import types

import trio
import trio.testing

from powerdev.daemon import supervisor
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.ops import oplog


async def test_a_change_while_the_first_line_is_made_is_logged_after_it(monkeypatch, caplog):
    devices = [Device(f"loop{i}", f"/dev/loop{i}", "b", 7, i) for i in range(5)]
    inventory = Inventory(devices[:4])
    name = f"first-line-{id(inventory)}"  # a resource the module's log has never seen
    plugin = types.SimpleNamespace(
        inventory=inventory, resource=types.SimpleNamespace(name=name), tracker=None
    )
    changed = threading.Event()
    describe = oplog.describe_change

    def described_once_the_change_is_in(*args):
        changed.wait(timeout=30)
        return describe(*args)

    monkeypatch.setattr(oplog, "describe_change", described_once_the_change_is_in)
    caplog.set_level(logging.INFO, logger=supervisor.__name__)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor._log_first_devices, plugin)
        try:
            await trio.testing.wait_all_tasks_blocked()
            inventory.publish(devices)  # a device event while the first line is made
            supervisor._log_devices(plugin)  # as following an event does
        finally:
            changed.set()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(name)]
    assert lines == [
        f"{name}: 4 devices: loop0, loop1, loop2, loop3",
        f"{name}: added loop4; now 5 devices",
    ]
