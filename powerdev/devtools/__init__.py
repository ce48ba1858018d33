"""Tools for developers, not part of the daemon: the bench and its device-event
measure, the probe-cost measure, the Trio step watch, the local runner with
its fake kubelet, drivers for the conformance kit's binaries (the kubelet's
device manager, the CDI library), a one-node control plane from the kit
(cluster/), and helpers that make device trees.

May import: anything in powerdev. No product package imports it, except the
command line, lazily, for the commands that are these tools.
"""
