package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// loaded is one load of the spec dirs into the library's cache, with what
// the library recorded about it.
type loaded struct {
	dirs      []string // as the cache holds them (filepath.Clean)
	cache     *cdi.Cache
	files     []specFile           // every file the library would read, in scan order
	specs     map[string]*cdi.Spec // the files the library accepted, by path
	errors    map[string][]string  // cache.GetErrors(), by path
	dirErrors map[string]string    // cdicheck's own check: a DIR that cannot be read
	conflicts []string
}

// specFile is a file the library's scan reads: a *.json or *.yaml entry that
// is not a directory, directly in a spec dir.
type specFile struct {
	path     string
	dir      string
	priority int
}

func load(dirs []string) *loaded {
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false)) // the error is always nil
	l := &loaded{
		dirs:      cache.GetSpecDirectories(),
		cache:     cache,
		specs:     map[string]*cdi.Spec{},
		errors:    map[string][]string{},
		dirErrors: map[string]string{},
	}
	for priority, dir := range l.dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			// The library skips a missing dir silently, and stops its scan
			// (silently too) at a dir it cannot read: either way, say so.
			l.dirErrors[dir] = err.Error()
		}
		// The same choice of files as the library's scan (spec-dirs.go).
		for _, entry := range entries {
			ext := filepath.Ext(entry.Name())
			if entry.IsDir() || (ext != ".json" && ext != ".yaml") {
				continue
			}
			path := filepath.Join(dir, entry.Name())
			l.files = append(l.files, specFile{path: path, dir: dir, priority: priority})
		}
	}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			l.specs[spec.GetPath()] = spec
		}
	}
	seen := map[string]bool{}
	for path, errs := range cache.GetErrors() {
		for _, err := range errs {
			text := err.Error()
			l.errors[path] = append(l.errors[path], text)
			// The library's own wording for two files of equal priority
			// that define the same device (cache.go, resolveConflict).
			if strings.HasPrefix(text, "conflicting device ") && !seen[text] {
				seen[text] = true
				l.conflicts = append(l.conflicts, text)
			}
		}
	}
	slices.Sort(l.conflicts)
	return l
}

// errorCount counts every error the library recorded (one per path it is
// recorded for) and each DIR that cannot be read.
func (l *loaded) errorCount() int {
	count := len(l.dirErrors)
	for _, errs := range l.errors {
		count += len(errs)
	}
	return count
}

type fileReport struct {
	Path               string   `json:"path"`
	Dir                string   `json:"dir"`
	Priority           int      `json:"priority"`
	Loaded             bool     `json:"loaded"`
	Kind               string   `json:"kind"`
	Vendor             string   `json:"vendor"`
	Class              string   `json:"class"`
	CDIVersion         string   `json:"cdiVersion"`
	MinRequiredVersion string   `json:"minRequiredVersion"`
	Devices            []string `json:"devices"`
	QualifiedDevices   []string `json:"qualifiedDevices"`
	Errors             []string `json:"errors"`
}

func (l *loaded) report(file specFile) fileReport {
	r := fileReport{
		Path:             file.path,
		Dir:              file.dir,
		Priority:         file.priority,
		Devices:          []string{},
		QualifiedDevices: []string{},
		Errors:           orEmpty(l.errors[file.path]),
	}
	var raw *cdispec.Spec
	if spec, ok := l.specs[file.path]; ok {
		r.Loaded = true
		r.Vendor, r.Class = spec.GetVendor(), spec.GetClass()
		raw = spec.Spec
		for _, device := range raw.Devices {
			r.QualifiedDevices = append(r.QualifiedDevices, spec.GetDevice(device.Name).GetQualifiedName())
		}
	} else if data, err := os.ReadFile(file.path); err == nil {
		// For diagnosis only: the library's parser, without its validation.
		raw, _ = cdi.ParseSpec(data)
	}
	if raw != nil {
		r.Kind, r.CDIVersion = raw.Kind, raw.Version
		r.MinRequiredVersion, _ = cdispec.MinimumRequiredVersion(raw) // the error is always nil
		for _, device := range raw.Devices {
			r.Devices = append(r.Devices, device.Name)
		}
	}
	return r
}

type validateReport struct {
	Command     string              `json:"command"`
	OK          bool                `json:"ok"`
	Library     moduleInfo          `json:"library"`
	SpecDirs    []string            `json:"specDirs"`
	DirErrors   map[string]string   `json:"dirErrors"`
	Specs       []fileReport        `json:"specs"`
	Devices     []string            `json:"devices"`
	OtherErrors map[string][]string `json:"otherErrors"`
	ErrorCount  int                 `json:"errorCount"`
	Conflicts   []string            `json:"conflicts"`
}

func validate(dirs []string) validateReport {
	l := load(dirs)
	r := validateReport{
		Command:     "validate",
		Library:     moduleOf(libraryModule),
		SpecDirs:    l.dirs,
		DirErrors:   l.dirErrors,
		Specs:       []fileReport{},
		Devices:     orEmpty(l.cache.ListDevices()),
		OtherErrors: map[string][]string{},
		ErrorCount:  l.errorCount(),
		Conflicts:   orEmpty(l.conflicts),
	}
	listed := map[string]bool{}
	allLoaded := true
	for _, file := range l.files {
		listed[file.path] = true
		report := l.report(file)
		allLoaded = allLoaded && report.Loaded
		r.Specs = append(r.Specs, report)
	}
	for path, errs := range l.errors {
		if !listed[path] {
			r.OtherErrors[path] = errs
		}
	}
	r.OK = allLoaded && r.ErrorCount == 0
	return r
}

func orEmpty[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}
