package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// emptyOCISpec is what the names are injected into.
const emptyOCISpec = `{"ociVersion":"1.3.0"}`

type injectReport struct {
	Command         string               `json:"command"`
	OK              bool                 `json:"ok"`
	Library         moduleInfo           `json:"library"`
	SpecDirs        []string             `json:"specDirs"`
	Requested       []string             `json:"requested"`
	Unresolved      []string             `json:"unresolved"`
	Error           string               `json:"error"`
	Conflicts       []string             `json:"conflicts"`
	SpecErrors      map[string][]string  `json:"specErrors"`
	DirErrors       map[string]string    `json:"dirErrors"`
	LinuxDevices    []linuxDevice        `json:"linuxDevices"`
	ResourceDevices []resourceDevice     `json:"resourceDevices"`
	Mounts          []mount              `json:"mounts"`
	Env             []string             `json:"env"`
	Hooks           map[string][]hook    `json:"hooks"`
	AdditionalGIDs  []uint32             `json:"additionalGids"`
	NetDevices      map[string]netDevice `json:"netDevices"`
	IntelRdt        *oci.LinuxIntelRdt   `json:"intelRdt"`
	OCISpec         *oci.Spec            `json:"ociSpec"`
}

// linuxDevice is an entry of linux.devices; a field the spec leaves unset
// (fileMode, uid, gid) is null.
type linuxDevice struct {
	Path     string       `json:"path"`
	Type     string       `json:"type"`
	Major    int64        `json:"major"`
	Minor    int64        `json:"minor"`
	FileMode *os.FileMode `json:"fileMode"`
	UID      *uint32      `json:"uid"`
	GID      *uint32      `json:"gid"`
}

// resourceDevice is a cgroup device rule (linux.resources.devices).
type resourceDevice struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"`
	Minor  *int64 `json:"minor"`
	Access string `json:"access"`
}

type mount struct {
	Destination string   `json:"destination"`
	Source      string   `json:"source"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
}

type hook struct {
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	Timeout *int     `json:"timeout"`
}

type netDevice struct {
	Name string `json:"name"`
}

func inject(dirs, names []string, strict bool) injectReport {
	l := load(dirs)
	var spec oci.Spec
	if err := json.Unmarshal([]byte(emptyOCISpec), &spec); err != nil {
		panic(err) // a constant
	}
	unresolved, err := l.cache.InjectDevices(&spec, names...)
	r := injectReport{
		Command:    "inject",
		Library:    moduleOf(libraryModule),
		SpecDirs:   l.dirs,
		Requested:  names,
		Unresolved: orEmpty(unresolved),
		Conflicts:  orEmpty(l.conflicts),
		SpecErrors: l.errors,
		DirErrors:  l.dirErrors,
		OCISpec:    &spec,
	}
	switch {
	case err != nil:
		r.Error = err.Error()
	case len(l.conflicts) > 0:
		r.Error = fmt.Sprintf("the CDI cache has %d conflicting device(s): %s",
			len(l.conflicts), l.conflicts[0])
	case strict && l.errorCount() > 0:
		r.Error = fmt.Sprintf("--strict: %d error(s) in the spec files or dirs", l.errorCount())
	}
	r.OK = r.Error == ""
	r.view(&spec)
	return r
}

// view fills the report's fields from the parts of the OCI spec that CDI edits.
func (r *injectReport) view(spec *oci.Spec) {
	r.LinuxDevices = []linuxDevice{}
	r.ResourceDevices = []resourceDevice{}
	r.Mounts = []mount{}
	r.Env = []string{}
	r.AdditionalGIDs = []uint32{}
	r.NetDevices = map[string]netDevice{}
	if linux := spec.Linux; linux != nil {
		for _, d := range linux.Devices {
			r.LinuxDevices = append(r.LinuxDevices, linuxDevice{
				Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor,
				FileMode: d.FileMode, UID: d.UID, GID: d.GID,
			})
		}
		if linux.Resources != nil {
			for _, d := range linux.Resources.Devices {
				r.ResourceDevices = append(r.ResourceDevices, resourceDevice{
					Allow: d.Allow, Type: d.Type, Major: d.Major, Minor: d.Minor, Access: d.Access,
				})
			}
		}
		for hostIf, d := range linux.NetDevices {
			r.NetDevices[hostIf] = netDevice{Name: d.Name}
		}
		r.IntelRdt = linux.IntelRdt
	}
	for _, m := range spec.Mounts {
		r.Mounts = append(r.Mounts, mount{
			Destination: m.Destination, Source: m.Source, Type: m.Type, Options: orEmpty(m.Options),
		})
	}
	if process := spec.Process; process != nil {
		r.Env = orEmpty(process.Env)
		r.AdditionalGIDs = orEmpty(process.User.AdditionalGids)
	}
	hooks := spec.Hooks
	if hooks == nil {
		hooks = &oci.Hooks{}
	}
	r.Hooks = map[string][]hook{
		"prestart":        hookList(hooks.Prestart), //nolint:staticcheck // deprecated in OCI, still applied by CDI
		"createRuntime":   hookList(hooks.CreateRuntime),
		"createContainer": hookList(hooks.CreateContainer),
		"startContainer":  hookList(hooks.StartContainer),
		"poststart":       hookList(hooks.Poststart),
		"poststop":        hookList(hooks.Poststop),
	}
}

func hookList(hooks []oci.Hook) []hook {
	list := []hook{}
	for _, h := range hooks {
		list = append(list, hook{Path: h.Path, Args: orEmpty(h.Args), Env: orEmpty(h.Env), Timeout: h.Timeout})
	}
	return list
}
