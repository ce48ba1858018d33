"""The asyncio door: the only package that touches asyncio, trio-asyncio,
grpclib and the generated code. Everything it offers is called from Trio and
deals in plain data (powerdev.allocation types, tuples, strings).

door.py (the loop and serve()), plugin_service.py (the DevicePlugin service),
registration.py (the Register call), kubelet_side.py (what a kubelet does:
serve Registration, dial a plugin; used by the fake kubelet).
"""

from powerdev.rpc.answers import Answers
from powerdev.rpc.door import asyncio_door, serve
from powerdev.rpc.kubelet_side import PluginClient, RegisterRefused, serve_registration
from powerdev.rpc.plugin_service import PluginService
from powerdev.rpc.registration import KubeletUnreachable, RegisterError, register

__all__ = [
    "Answers",
    "KubeletUnreachable",
    "PluginClient",
    "PluginService",
    "RegisterError",
    "RegisterRefused",
    "asyncio_door",
    "register",
    "serve",
    "serve_registration",
]
