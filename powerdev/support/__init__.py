"""Small Trio building blocks that know nothing of devices, configs or the
kubelet: one inotify instance for the daemon, the one backoff rule, and a
single connect to a unix socket.

May import: the standard library and Trio. Nothing else of powerdev.
"""
