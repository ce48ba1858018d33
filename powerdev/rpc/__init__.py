"""The asyncio door: the only package that touches asyncio, trio-asyncio,
grpclib and the generated code. Everything it offers is called from Trio and
deals in plain data (powerdev.resources.allocation types, tuples, strings).

door.py (the loop and serve()), plugin_service.py (the DevicePlugin service),
register.py (the Register call), podresources.py (the kubelet's
PodResources List), kubelet_side.py (what a kubelet does: serve
Registration, dial a plugin), dra_service.py (a DRA driver's
registration and node services, over powerdev.dra.claims; imported by its
own name, only when a resource says "api": "dra"). kubelet_side.py is for the fake kubelet and
tests: import it by its own name, so that the daemon never loads it.

May import: support, devices, config, resources, ops (its metrics), dra, the
generated code. Never daemon or cli.
"""

from powerdev.rpc.answers import Answers
from powerdev.rpc.door import asyncio_door, serve
from powerdev.rpc.plugin_service import PluginService
from powerdev.rpc.register import KubeletUnreachable, RegisterError, register

__all__ = [
    "Answers",
    "KubeletUnreachable",
    "PluginService",
    "RegisterError",
    "asyncio_door",
    "register",
    "serve",
]
