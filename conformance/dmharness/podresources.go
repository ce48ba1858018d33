package main

// The kubelet's PodResources v1 service, on <plugin dir>/../pod-resources/
// kubelet.sock (the layout of /var/lib/kubelet), fed by the same device
// manager and the harness's pods: what a node agent asks to learn which
// pod holds which device. The harness has no CPU, memory or DRA manager,
// so those lists are empty, as on a kubelet with those managers off.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"google.golang.org/grpc"
)

func podResourcesSocket(pluginDir string) string {
	return filepath.Join(filepath.Dir(pluginDir), "pod-resources", "kubelet.sock")
}

// devicesProvider answers from the manager of the moment (it changes on restart).
type devicesProvider struct{ h *harness }

func (d devicesProvider) UpdateAllocatedDevices() { d.h.manager().UpdateAllocatedDevices() }

func (d devicesProvider) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	return containerDevices(d.h.manager().GetDevices(podUID, container))
}

func (d devicesProvider) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return containerDevices(d.h.manager().GetAllocatableDevices())
}

// containerDevices: one entry per device and NUMA node, as the kubelet's
// container manager reports them.
func containerDevices(devices devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for _, resource := range sortedKeys(devices) {
		for _, id := range sortedKeys(devices[resource]) {
			nodes := devices[resource][id].GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
				continue
			}
			for _, node := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource,
					DeviceIds:    []string{id},
					Topology: &podresourcesapi.TopologyInfo{
						Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}},
					},
				})
			}
		}
	}
	return out
}

type podsProvider struct{ h *harness }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.h.activePods() }
func (p podsProvider) GetPods() []*v1.Pod       { return p.h.activePods() }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.h.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }

type noDynamicResources struct{}

func (noDynamicResources) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// servePodResources starts the service as the kubelet does (its rate
// limiter, the v1 server) on a fresh socket.
func servePodResources(ctx context.Context, h *harness, socket string) (*grpc.Server, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("podresources socket: %w", err)
	}
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods:             podsProvider{h},
		Devices:          devicesProvider{h},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDynamicResources{},
	}))
	go func() { _ = server.Serve(listener) }()
	return server, nil
}
