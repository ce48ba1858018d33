"""Where the kubelet lives: the device plugin API's paths and names, and a
watcher that notices the kubelet restart (inotify on the device-plugins
directory). The fake kubelet is a developer tool: powerdev.devtools.

May import: support.
"""
