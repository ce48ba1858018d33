// Command cdicheck gives tests the verdict of the CDI library that container
// runtimes use (tags.cncf.io/container-device-interface): it loads spec dirs
// into the library's cache and injects device names into an OCI spec, adding
// no parsing or validation of its own. Its interface (subcommands validate,
// inject and version; JSON on stdout; exit 0 ok, 1 refused, 2 usage) is the
// one powerdev/kubelet/cdicheck.py and the CDI tests speak.
//
// Files: main.go the command line; load.go the cache and what it recorded;
// inject.go the OCI spec and its view; version.go the compiled-in versions.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

const usage = `usage:
  cdicheck validate DIR...
  cdicheck inject [--strict] DIR... -- NAME...
  cdicheck version
All output is JSON on stdout. Exit codes: 0 ok, 1 the library reported an
error, 2 usage error.`

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		return usageError("no command given")
	}
	command, rest := args[0], args[1:]
	switch command {
	case "validate":
		dirs, err := dirArgs(rest)
		if err != nil {
			return usageError(err.Error())
		}
		report := validate(dirs)
		return emit(report, report.OK)
	case "inject":
		strict := len(rest) > 0 && rest[0] == "--strict"
		if strict {
			rest = rest[1:]
		}
		split := indexOf(rest, "--")
		if split < 0 {
			return usageError("inject: no '--' between the DIRs and the NAMEs")
		}
		dirs, err := dirArgs(rest[:split])
		if err != nil {
			return usageError("inject: " + err.Error())
		}
		names := rest[split+1:]
		if len(names) == 0 {
			return usageError("inject: no NAME after '--'")
		}
		report := inject(dirs, names, strict)
		if !report.OK {
			fmt.Fprintln(os.Stderr, "cdicheck inject: "+oneLine(report.Error))
		}
		return emit(report, report.OK)
	case "version":
		if len(rest) != 0 {
			return usageError("version takes no arguments")
		}
		return emit(version(), true)
	default:
		return usageError(fmt.Sprintf("unknown command %q", command))
	}
}

// dirArgs checks that there is at least one DIR and that none looks like an
// option (a typo such as "--strct" would otherwise be taken for a dir; a dir
// whose name starts with "-" can be given as "./-name").
func dirArgs(args []string) ([]string, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no DIR given")
	}
	for _, arg := range args {
		if strings.HasPrefix(arg, "-") {
			return nil, fmt.Errorf("unknown option %q", arg)
		}
	}
	return args, nil
}

func indexOf(args []string, want string) int {
	for i, arg := range args {
		if arg == want {
			return i
		}
	}
	return -1
}

func usageError(message string) int {
	fmt.Fprintf(os.Stderr, "cdicheck: %s\n%s\n", message, usage)
	return exitUsage
}

// emit writes the report as JSON on stdout and returns the exit code.
func emit(report any, ok bool) int {
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(report); err != nil {
		fmt.Fprintf(os.Stderr, "cdicheck: writing the JSON report: %v\n", err)
		return exitError
	}
	if ok {
		return exitOK
	}
	return exitError
}

func oneLine(text string) string {
	return strings.Join(strings.Fields(text), " ")
}
