package normalize

import (
	"fmt"
	"math"
	"slices"
)

// index groups the samples by uid, giving each uid a dense id, so the per-group work indexes slices.
type index struct {
	uids []string // by group id, in order of first appearance
	// Group g's samples are order[start[g]:start[g+1]], in input order. When every uid's samples are
	// contiguous in the input (the usual case) order is nil and they are samples[start[g]:start[g+1]].
	order []int32
	start []int32
}

// newIndex interns the uids and groups the samples by uid, checking every score on the way.
func newIndex(samples []Sample) (index, error) {
	var uids interner
	var group []int32 // group id of each sample, only once the uids are found not to be contiguous
	var start []int32 // while contiguous: where each uid's run starts
	prev := int32(-1)
	for i := range samples {
		x := &samples[i]
		if !(math.Abs(x.Score) <= MaxScore) { // NaN fails too
			return index{}, fmt.Errorf("sample %d (uid %q, traj_uid %q, agent %q): score %v: want a finite value within ±%g",
				i, x.UID, x.TrajUID, x.Agent, x.Score, MaxScore)
		}
		g := uids.id(x.UID)
		switch {
		case group != nil:
			group[i] = g
		case int(g) == len(start): // a new uid starts a run
			start = append(start, int32(i))
		case g != prev: // a uid seen before reappears: fall back to a counting sort
			group = make([]int32, len(samples))
			for r := range start {
				end := int32(i)
				if r+1 < len(start) {
					end = start[r+1]
				}
				for j := start[r]; j < end; j++ {
					group[j] = int32(r)
				}
			}
			group[i] = g
		}
		prev = g
	}
	idx := index{uids: uids.names}
	if group == nil {
		idx.start = append(start, int32(len(samples)))
		return idx, nil
	}
	// A counting sort by group id.
	idx.start = make([]int32, len(uids.names)+1)
	for _, g := range group {
		idx.start[g+1]++
	}
	for g := range uids.names {
		idx.start[g+1] += idx.start[g]
	}
	next := slices.Clone(idx.start[:len(uids.names)])
	idx.order = make([]int32, len(samples))
	for i, g := range group {
		idx.order[next[g]] = int32(i)
		next[g]++
	}
	return idx, nil
}

// interner assigns ids 0, 1, … to strings in order of first appearance. A repeat of the last string
// costs one comparison; a handful of names is scanned linearly; more go through a map.
type interner struct {
	names []string
	ids   map[string]int32 // only when len(names) > linearScan
	last  int32            // id of the last string looked up, if < len(names)
}

const linearScan = 8

func (in *interner) id(s string) int32 {
	if uint(in.last) < uint(len(in.names)) && same(in.names[in.last], s) {
		return in.last
	}
	id, ok := in.lookup(s)
	if !ok {
		id = int32(len(in.names))
		in.names = append(in.names, s)
		switch {
		case len(in.names) == linearScan+1:
			in.ids = make(map[string]int32, 2*len(in.names))
			for i, name := range in.names {
				in.ids[name] = int32(i)
			}
		case len(in.names) > linearScan+1:
			in.ids[s] = id
		}
	}
	in.last = id
	return id
}

// same is a == b with the first and last bytes compared inline, which settles most mismatches of
// short ids without a call to the runtime's memequal.
func same(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) > 0 && (a[0] != b[0] || a[len(a)-1] != b[len(b)-1]) {
		return false
	}
	return a == b
}

func (in *interner) lookup(s string) (int32, bool) {
	if len(in.names) <= linearScan {
		for i, name := range in.names {
			if same(name, s) {
				return int32(i), true
			}
		}
		return 0, false
	}
	id, ok := in.ids[s]
	return id, ok
}

// reset forgets every name, keeping the storage.
func (in *interner) reset() {
	clear(in.names)
	in.names = in.names[:0]
	in.ids = nil
}
