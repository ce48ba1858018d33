// Package lineproto is the command protocol the kit's harnesses speak: one
// command per line on stdin (words split on white space), one JSON object
// per line on stdout. Each answer echoes the command as "cmd", carries "t"
// (milliseconds since the epoch) and, when the command failed, "error".
// "quit" answers and ends the loop.
package lineproto

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

var spaces = regexp.MustCompile(`\s+`)

// Serve reads commands until stdin ends or "quit", handing each to run.
// A reply it cannot write ends the process: nobody is listening any more.
func Serve(name string, run func(words []string) (map[string]any, error)) {
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		words := spaces.Split(line, -1)
		answer, err := run(words)
		if answer == nil {
			answer = map[string]any{}
		}
		answer["cmd"] = line
		answer["t"] = time.Now().UnixMilli()
		if err != nil {
			answer["error"] = err.Error()
		}
		if encodeErr := out.Encode(answer); encodeErr != nil {
			fmt.Fprintln(os.Stderr, name+":", encodeErr)
			os.Exit(1)
		}
		if words[0] == "quit" {
			break
		}
	}
}
