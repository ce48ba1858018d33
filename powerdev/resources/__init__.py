"""Resources as views over the host's devices.

Each resource of the config lists the devices its patterns and properties
match (matching.py), kept in step with the host by its tracker
(tracker.py), and a node-wide ledger (ownership.py) makes sure one device
goes to one resource and one holder at a time. What the kubelet is told
(units, Allocate answers, preferences) is allocation.py; plugin.py is one
resource as served; cdi.py writes its CDI spec; families.py says how a
DRA pool publishes devices that share blocks (shared counters, or apart).

May import: support, devices, config. powerdev.devices never imports this
package.
"""
