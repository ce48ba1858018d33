"""The running daemon: the one supervisor (its root nursery, event sources
and signals), each resource's registration loop, config reloads, the CDI
spec writers' lifetimes, and what pods hold as the kubelet says.

May import: every product package below it (support, devices, config,
resources, ops, dra, rpc, kubelet). Only cli and devtools import it.
"""
