//go:build lockorder

package lockorder

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

const enabled = true

// Enabled reports whether this build checks the lock order (the lockorder build tag).
func Enabled() bool { return true }

// held is a mutex a goroutine holds.
type held struct {
	m    any
	rank int
	name string
}

var (
	mu    sync.Mutex
	holds = map[uint64][]held{} // goroutine id -> mutexes held, in the order taken
)

// goid is the current goroutine's id, read from its stack header ("goroutine 42 [...").
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		panic("lockorder: cannot read the goroutine id: " + err.Error())
	}
	return id
}

// acquire checks that the goroutine holds no mutex ranked at or above rank and records m.
func acquire(m any, rank int, name string) {
	g := goid()
	mu.Lock()
	hs := holds[g]
	for _, h := range hs {
		if h.rank >= rank {
			mu.Unlock()
			panic(fmt.Sprintf("lockorder: %s (rank %d) taken while holding %s (rank %d): the lock order says %s comes first",
				name, rank, h.name, h.rank, lower(name, rank, h.name, h.rank)))
		}
	}
	holds[g] = append(hs, held{m: m, rank: rank, name: name})
	mu.Unlock()
}

func lower(a string, ra int, b string, rb int) string {
	if ra < rb {
		return a
	}
	return b
}

// release forgets m from the goroutine's held mutexes (a mutex unlocked by another goroutine
// than the one that locked it is simply not found).
func release(m any) {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	hs := holds[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].m == m {
			hs = append(hs[:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(holds, g)
	} else {
		holds[g] = hs
	}
}
