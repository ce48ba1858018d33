"""Dynamic Resource Allocation (resource.k8s.io/v1) for resources that say
`"api": "dra"`: the same devices as the device plugin API hands out, from
the same trackers, published as ResourceSlices and prepared for claims.

names.py (device, pool and slice names), slices.py (what a resource's pool
holds, and keeping it published from the inventory), kubeapi.py (the API
server client, lightkube; imported only when a DRA resource is configured),
claims.py (NodePrepareResources and NodeUnprepareResources as plain Trio:
the claim's allocation checked, its CDI spec written, the checkpoint).
The gRPC services that call claims.py live in rpc/dra_service.py.

May import: support, devices, config, resources, ops. Never rpc, daemon or cli.
"""
