"""The running daemon: the one supervisor (its root nursery, event sources
and signals), each resource's registration loop, and config reloads.

May import: every product package below it (support, devices, config,
resources, ops, rpc, kubelet). Only cli and devtools import it.
"""
