"""Tools for developers, not part of the daemon: the bench and its device-event
measure, the probe-cost measure, the Trio step watch, the local runner with
its fake kubelet, drivers for the conformance kit's binaries (the kubelet's
device manager, the CDI library), a one-node control plane from the kit
(cluster/), helpers that make device trees, and the design's floor
(floor.py: a plugin on the design's libraries that answers with fixed bytes;
the one module outside powerdev.rpc that touches grpclib, since the floor
must not load powerdev's own modules).

May import: anything in powerdev. No product package imports it, except the
command line, lazily, for the commands that are these tools.
"""
