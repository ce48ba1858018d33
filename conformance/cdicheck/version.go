package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/mod/module"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	libraryModule = "tags.cncf.io/container-device-interface"
	specsGoModule = "tags.cncf.io/container-device-interface/specs-go"
)

// moduleInfo is a module compiled in, as the Go build info records it.
type moduleInfo struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	Commit  string `json:"commit"` // from a pseudo-version; "" for a tagged release
}

// moduleOf looks path up in the build info; the version is "" if it is not
// compiled in.
func moduleOf(path string) moduleInfo {
	info := moduleInfo{Module: path}
	if dep := buildDep(path); dep != nil {
		info.Version = dep.Version
		if module.IsPseudoVersion(dep.Version) {
			info.Commit, _ = module.PseudoVersionRev(dep.Version)
		}
	}
	return info
}

// buildDep is the module as compiled in: a replacement in go.mod, if any,
// stands for it.
func buildDep(path string) *debug.Module {
	build, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	for _, dep := range build.Deps {
		if dep.Path == path {
			if dep.Replace != nil {
				return dep.Replace
			}
			return dep
		}
	}
	return nil
}

type versionReport struct {
	Library               moduleInfo        `json:"library"`
	SpecsGoModule         moduleInfo        `json:"specsGoModule"`
	CurrentSpecVersion    string            `json:"currentSpecVersion"`
	SupportedSpecVersions []string          `json:"supportedSpecVersions"`
	OCIRuntimeSpecVersion string            `json:"ociRuntimeSpecVersion"`
	GoVersion             string            `json:"goVersion"`
	Modules               map[string]string `json:"modules"`
}

func version() versionReport {
	r := versionReport{
		Library:               moduleOf(libraryModule),
		SpecsGoModule:         moduleOf(specsGoModule),
		CurrentSpecVersion:    cdispec.CurrentVersion,
		SupportedSpecVersions: supportedSpecVersions(),
		OCIRuntimeSpecVersion: oci.Version,
		GoVersion:             runtime.Version(),
		Modules:               map[string]string{},
	}
	if build, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range build.Deps {
			switch {
			case dep.Replace == nil:
				r.Modules[dep.Path] = dep.Version
			case dep.Replace.Version == "": // a local directory
				r.Modules[dep.Path] = dep.Replace.Path
			default:
				r.Modules[dep.Path] = dep.Replace.Path + "@" + dep.Replace.Version
			}
		}
	}
	return r
}

// supportedSpecVersions asks the library's ValidateVersion about each X.Y.Z
// with X < 10, Y < 100 and Z < 10, for a minimal spec: one device and no
// edits, so that no feature raises the version it needs. The library keeps
// its list of versions to itself; this grid holds every CDI version so far
// (0.1.0 to 1.1.0) with room to spare.
func supportedSpecVersions() []string {
	supported := []string{}
	for x := range 10 {
		for y := range 100 {
			for z := range 10 {
				v := fmt.Sprintf("%d.%d.%d", x, y, z)
				spec := cdispec.Spec{Version: v, Kind: "example.com/class", Devices: []cdispec.Device{{Name: "dev0"}}}
				if cdispec.ValidateVersion(&spec) == nil {
					supported = append(supported, v)
				}
			}
		}
	}
	return supported
}
