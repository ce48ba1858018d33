package main

// The device manager serves its registration socket and writes its
// checkpoint at fixed paths under /var/lib/kubelet/device-plugins. To run
// it on a test's temp directory without changing its code, the harness
// lives in a mount namespace of its own, where that path is the test's
// directory, bind-mounted. Nothing of this is seen outside the process.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	namespaceMarker = "DMHARNESS_PRIVATE_MOUNTS"
	kubeletDir      = "/var/lib/kubelet"
	pluginDir       = kubeletDir + "/device-plugins"
)

// enterPrivateMountNamespace re-executes the harness, same PID, in a new
// mount namespace. unshare(CLONE_NEWNS) changes only the calling thread of a
// Go program, and execve keeps that thread's namespace for the whole new
// image: so lock the thread, unshare, exec. A no-op once inside.
func enterPrivateMountNamespace() error {
	if outside := os.Getenv(namespaceMarker); outside != "" {
		// Set by our own re-exec to the namespace we left; an inherited
		// variable must never make us mount over the host's
		// /var/lib/kubelet, so the namespace must really be another.
		own, err := os.Readlink("/proc/self/ns/mnt")
		if err != nil || own == outside {
			return fmt.Errorf("%s is set, but this process is still in mount namespace %s: unset it",
				namespaceMarker, outside)
		}
		return nil
	}
	outside, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a private mount namespace for /var/lib/kubelet/device-plugins "+
			"needs CAP_SYS_ADMIN (run as root): unshare: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := append(os.Environ(), namespaceMarker+"="+outside)
	return syscall.Exec(self, os.Args, env)
}

// mounted is what mountPluginDir bound last, so that a second start on
// another directory replaces it.
var mounted bool

// mountPluginDir makes /var/lib/kubelet/device-plugins, in this process
// only, the directory dir. The first call stops mount propagation to the
// host and lays a tmpfs where the path is missing, so that no directory is
// ever made on the host.
func mountPluginDir(dir string) error {
	if !mounted {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("making / private: %w", err)
		}
		if err := ensurePath(pluginDir); err != nil {
			return err
		}
	} else if err := unix.Unmount(pluginDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the last plugin dir: %w", err)
	}
	if err := unix.Mount(dir, pluginDir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s to %s: %w", dir, pluginDir, err)
	}
	mounted = true
	return nil
}

// ensurePath makes path exist in this namespace: a tmpfs over its deepest
// existing ancestor (a fresh, empty one, private to us), then mkdir.
func ensurePath(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	base := filepath.Dir(path)
	for {
		if _, err := os.Stat(base); err == nil {
			break
		}
		base = filepath.Dir(base)
	}
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("a tmpfs on %s: %w", base, err)
	}
	return os.MkdirAll(path, 0o750)
}
