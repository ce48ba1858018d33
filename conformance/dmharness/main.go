package main

import (
	_ "k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	_ "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	_ "k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	_ "k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

func main() {}
