"""The kubelet's side of things: its paths, a watcher that notices it
restart (inotify on the device-plugins directory), and a fake kubelet
(fake.py) that behaves like the real one; tests and `powerdev local` use it."""
