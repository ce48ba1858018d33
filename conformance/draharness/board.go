package main

import (
	"sync"
	"time"
)

// state is what the harness has seen happen: registrations (registry.go),
// the ResourceSlice deletions the kubelet made (apiserver.go), and the pod
// updates the DRA manager asked for when a device's health changed
// (main.go).
type state struct {
	drivers []registration
	events  []handlerEvent
	wipes   []wipe
	updates []podUpdate
}

// podUpdate: the DRA manager's word to the kubelet's sync loop (its
// Updates channel) that these pods' status must be written again, since
// the health of a device they hold changed.
type podUpdate struct {
	T    int64    `json:"t"` // ms since the epoch
	Pods []string `json:"pods"`
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
