"""Allocate answers on either side of answers.INLINE (encoded on the Trio
thread, or in a worker thread): byte for byte betterproto's encoding of the
same AllocateResponse, whichever came before."""

from __future__ import annotations

import pytest

from powerdev._proto.v1beta1 import (
    AllocateResponse,
    CdiDevice,
    ContainerAllocateResponse,
    DeviceSpec,
)
from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.resources.allocation import CdiGrant, DeviceGrant
from powerdev.resources.plugin import Plugin
from powerdev.rpc.answers import INLINE, Answers


def device_grant(n: int, start: int = 0) -> tuple[DeviceGrant, ...]:
    return tuple(
        DeviceGrant(f"/dev/dm-{i}", f"/dev/c{i}", "rw" if i % 2 else "rwm")
        for i in range(start, start + n)
    )


def cdi_grant(n: int) -> CdiGrant:
    return CdiGrant(tuple(f"power-dev-plugin/dev=dm-{i}" for i in range(n)))


def betterproto(grant: tuple[DeviceGrant, ...] | CdiGrant, containers: int) -> bytes:
    if isinstance(grant, CdiGrant):
        one = ContainerAllocateResponse(cdi_devices=[CdiDevice(name=n) for n in grant.names])
    else:
        one = ContainerAllocateResponse(
            devices=[
                DeviceSpec(
                    container_path=g.container_path,
                    host_path=g.host_path,
                    permissions=g.permissions,
                )
                for g in grant
            ]
        )
    return bytes(AllocateResponse(container_responses=[one] * containers))


SIZES = [1, INLINE, INLINE + 1, 500]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("make", [device_grant, cdi_grant], ids=["devices", "cdi"])
async def test_an_answer_is_betterprotos_bytes_on_either_side_of_inline(n, make):
    answers = Answers(Plugin(ResourceConfig(), Inventory(()), refresh=None, spec=None))
    grant = make(n)
    for containers in (1, 3):
        assert await answers.allocate([grant] * containers) == betterproto(grant, containers)


async def test_small_and_large_answers_in_turn_never_give_the_last_ones_bytes():
    """ "each" hands out a new grant per Allocate: the cached answer is
    keyed by the grant, small or large."""
    answers = Answers(Plugin(ResourceConfig(), Inventory(()), refresh=None, spec=None))
    grants = [device_grant(1, 7), device_grant(300), device_grant(2, 40), device_grant(1, 7)]
    grants.append(grants[1])
    for grant in grants:
        assert await answers.allocate([grant]) == betterproto(grant, 1)
    mixed = [grants[0], grants[1]]
    assert await answers.allocate(mixed) == betterproto(grants[0], 1) + betterproto(grants[1], 1)
