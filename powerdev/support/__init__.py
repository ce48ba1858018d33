"""Small Trio building blocks that know nothing of devices, configs or the
kubelet: one inotify instance for the daemon, the one backoff rule, a
single connect to a unix socket, a bounded accept loop, and the C
allocator's settings made once at start.

May import: the standard library and Trio. Nothing else of powerdev.
"""
