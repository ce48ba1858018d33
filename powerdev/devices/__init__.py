"""The host's devices, as plain data, knowing no config and no resource.

model.py (Device and its stable ID), discovery.py (nodes by path, patterns,
block devices, control nodes), identity.py (identities, NUMA, place among
the disks), inuse.py (the host-use rule), inventory.py (a versioned
snapshot that streams wait on), events.py and its sources (netlink,
inotify, mounts and swap). Nothing here knows about gRPC, the kubelet or
powerdev.config; powerdev.resources builds on it.

May import: support.
"""
