"""The asyncio door: the only package that touches asyncio, trio-asyncio,
grpclib and the wire format. Everything it offers is called from Trio and
deals in plain data (powerdev.allocation types, tuples, strings).

door.py (the loop, serve(), one client call, the codec), wire.py (the
API's messages, encoded and decoded by hand), plugin_service.py (the
DevicePlugin service), registration.py (the Register call), podresources.py
(the kubelet's PodResources List), kubelet_side.py (what a kubelet does:
serve Registration, dial a plugin; used by the fake kubelet, and the only
user of the generated code in powerdev/_proto).

kubelet_side.py, and with it betterproto and the generated code, is
imported only when one of its names is first asked for: the daemon never
asks, and so never pays for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from powerdev.rpc.answers import Answers
from powerdev.rpc.door import asyncio_door, serve
from powerdev.rpc.plugin_service import PluginService
from powerdev.rpc.registration import KubeletUnreachable, RegisterError, register

if TYPE_CHECKING:
    from powerdev.rpc.kubelet_side import PluginClient, RegisterRefused, serve_registration

_KUBELET_SIDE = ("PluginClient", "RegisterRefused", "serve_registration")

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


def __getattr__(name: str) -> Any:
    if name in _KUBELET_SIDE:
        from powerdev.rpc import kubelet_side

        return getattr(kubelet_side, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
