"""A one-node Kubernetes control plane from the conformance kit, for the
tests (tests/e2e, tests/dra) and `powerdev bench --dra`: controlplane.py
starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager on
127.0.0.1 (or only the first two) and stops them; pki.py writes its
certificates and kubeconfigs; client.py is a small JSON client as its
admin. Nothing in the daemon uses it.
"""
