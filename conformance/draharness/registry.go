package main

import (
	"sort"
	"strings"
	"time"

	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// recordingHandler is the DRA manager's own plugin handler, as the plugin
// manager calls it, with each call and its outcome written down on the
// board: which drivers are registered now, and what happened in order.
// It decides nothing itself.
type recordingHandler struct {
	inner   cache.PluginHandler
	board   *board
	plugins string // the PLUGINS_DIR given to start, for "under_plugins_dir"
}

var _ cache.PluginHandler = &recordingHandler{}

type registration struct {
	Name     string   `json:"name"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions"`
	// Under PLUGINS_DIR/, where the kubelet's plugin directory holds
	// drivers' sockets on a real node (/var/lib/kubelet/plugins/).
	UnderPluginsDir bool  `json:"under_plugins_dir"`
	Since           int64 `json:"since"` // ms since the epoch
}

type handlerEvent struct {
	T        int64    `json:"t"`
	Call     string   `json:"call"` // validate, register, deregister
	Name     string   `json:"name"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func (r *recordingHandler) ValidatePlugin(name, endpoint string, versions []string) error {
	err := r.inner.ValidatePlugin(name, endpoint, versions)
	r.board.update(func(s *state) {
		s.events = append(s.events, newEvent("validate", name, endpoint, versions, err))
	})
	return err
}

func (r *recordingHandler) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	err := r.inner.RegisterPlugin(name, endpoint, versions, timeout)
	r.board.update(func(s *state) {
		s.events = append(s.events, newEvent("register", name, endpoint, versions, err))
		if err == nil {
			s.drivers = append(s.drivers, registration{
				Name:            name,
				Endpoint:        endpoint,
				Versions:        append([]string{}, versions...),
				UnderPluginsDir: r.plugins != "" && strings.HasPrefix(endpoint, strings.TrimSuffix(r.plugins, "/")+"/"),
				Since:           time.Now().UnixMilli(),
			})
		}
	})
	return err
}

func (r *recordingHandler) DeRegisterPlugin(name, endpoint string) {
	r.inner.DeRegisterPlugin(name, endpoint)
	r.board.update(func(s *state) {
		s.events = append(s.events, newEvent("deregister", name, endpoint, nil, nil))
		kept := s.drivers[:0]
		for _, d := range s.drivers {
			if d.Name != name || d.Endpoint != endpoint {
				kept = append(kept, d)
			}
		}
		s.drivers = kept
	})
}

func newEvent(call, name, endpoint string, versions []string, err error) handlerEvent {
	event := handlerEvent{T: time.Now().UnixMilli(), Call: call, Name: name, Endpoint: endpoint, Versions: versions}
	if err != nil {
		event.Error = err.Error()
	}
	return event
}

// registered: the drivers registered now, sorted by name then endpoint.
func (s *state) registered() []registration {
	out := append([]registration{}, s.drivers...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Endpoint < out[j].Endpoint
	})
	return out
}

func (s *state) has(name string) bool {
	for _, d := range s.drivers {
		if d.Name == name {
			return true
		}
	}
	return false
}
