"""Device inventory: what device nodes a resource has, as plain data.

model.py (Device and its stable ID), discovery.py (scan /dev and /sys, match
patterns), inventory.py (a versioned snapshot that streams wait on). Nothing
here knows about gRPC or the kubelet.
"""
