package main

import (
	"sync"
	"time"
)

// state is what the harness has seen happen: registrations (registry.go)
// and the ResourceSlice deletions the kubelet made (apiserver.go).
type state struct {
	drivers []registration
	events  []handlerEvent
	wipes   []wipe
}

// board holds the state and wakes whoever waits on it at each change:
// the wait commands block on a channel that every update closes, never on
// a timer.
type board struct {
	mu      sync.Mutex
	s       state
	changed chan struct{}
}

func newBoard() *board { return &board{changed: make(chan struct{})} }

func (b *board) update(change func(*state)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	change(&b.s)
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *board) read(look func(*state)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	look(&b.s)
}

// waitFor: until cond holds (true) or the time is up (false).
func (b *board) waitFor(timeout time.Duration, cond func(*state) bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		b.mu.Lock()
		ok := cond(&b.s)
		changed := b.changed
		b.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}
