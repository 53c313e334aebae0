package choice

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Problems collects the problems of a config section, each naming its key ("dist.timeout_s: must be
// in [1, 604800] (got 0)"), so that every component validates its own section with the same words.
// The zero value is ready to use.
type Problems struct{ list []string }

// Bad records a problem with key.
func (p *Problems) Bad(key, format string, args ...any) {
	p.list = append(p.list, key+": "+fmt.Sprintf(format, args...))
}

// Add takes the problems of a section validated elsewhere (an error of lines, or of "; "-joined
// problems), one problem each.
func (p *Problems) Add(err error) {
	if err == nil {
		return
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		for _, s := range strings.Split(line, "; ") {
			if s = strings.TrimSpace(s); s != "" {
				p.list = append(p.list, s)
			}
		}
	}
}

// IntIn wants lo ≤ v ≤ hi.
func (p *Problems) IntIn(key string, v, lo, hi int) {
	if v < lo || v > hi {
		p.Bad(key, "must be in [%d, %d] (got %d)", lo, hi, v)
	}
}

// AtLeast wants v ≥ lo.
func (p *Problems) AtLeast(key string, v, lo int) {
	if v < lo {
		p.Bad(key, "must be ≥ %d (got %d)", lo, v)
	}
}

// Positive wants a finite number > 0.
func (p *Problems) Positive(key string, v float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		p.Bad(key, "must be a finite number > 0 (got %g)", v)
	}
}

// NonNeg wants a finite number ≥ 0.
func (p *Problems) NonNeg(key string, v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		p.Bad(key, "must be a finite number ≥ 0 (got %g)", v)
	}
}

// Fraction wants a number in [0, 1) (closed above when closed is true).
func (p *Problems) Fraction(key string, v float64, closed bool) {
	if !(v >= 0 && (v < 1 || closed && v == 1)) {
		hi := ")"
		if closed {
			hi = "]"
		}
		p.Bad(key, "must be in [0, 1%s (got %g)", hi, v)
	}
}

// OneOf wants v among allowed.
func (p *Problems) OneOf(key, v string, allowed []string) {
	if !slices.Contains(allowed, v) {
		p.Bad(key, "must be one of %s (got %q)", strings.Join(allowed, ", "), v)
	}
}

// Registered wants v registered in set (by the package that implements it).
func (p *Problems) Registered(key, v string, set *Set) { p.OneOf(key, v, set.Names()) }

// List returns the problems recorded, sorted.
func (p *Problems) List() []string {
	out := slices.Clone(p.list)
	sort.Strings(out)
	return out
}

// Err returns the problems as one error, a problem per line, sorted (nil when there are none).
func (p *Problems) Err() error {
	if len(p.list) == 0 {
		return nil
	}
	return errors.New(strings.Join(p.List(), "\n"))
}
