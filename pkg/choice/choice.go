// Package choice is the registry behind the config keys that name an implementation (a loss
// aggregation mode, a KL estimator, an engine, a model family …). Each set belongs to the package that
// implements its choices: that package declares the set and registers every name it implements, and
// pkg/config checks a config by asking the sets, so a new choice is its implementation plus one
// registration line, and pkg/config never lists another package's names. The package is
// dependency-free so that pkg/config builds and tests without libtorch: a choice implemented on
// libtorch (pkg/train, pkg/policy) is registered in a libtorch-free sub-package of its implementer
// (pkg/train/algo), which the implementer checks it covers; pkg/arch holds the model families
// pkg/policy runs.
package choice

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Set is one registry: the names a key accepts, in registration order.
type Set struct {
	what  string
	mu    sync.RWMutex
	names []string
}

// NewSet returns a set with names registered in order; what names the choice in errors
// ("loss aggregation mode").
func NewSet(what string, names ...string) *Set {
	s := &Set{what: what}
	for _, n := range names {
		s.Add(n)
	}
	return s
}

// Add registers name and returns it (`var Local = Kinds.Add("local")`). A name registered twice
// or an empty one panics: both are programming errors found by any test of the registering package.
func (s *Set) Add(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == "" || slices.Contains(s.names, name) {
		panic(fmt.Sprintf("choice: %s %q registered twice or empty", s.what, name))
	}
	s.names = append(s.names, name)
	return name
}

// Names returns the registered names in registration order (a copy).
func (s *Set) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.names)
}

// Has reports whether name is registered.
func (s *Set) Has(name string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Contains(s.names, name)
}

// String lists the names as "a, b, c" (for errors and help texts).
func (s *Set) String() string { return strings.Join(s.Names(), ", ") }

// Check returns nil for a registered name, else an error naming the choices.
func (s *Set) Check(name string) error {
	if s.Has(name) {
		return nil
	}
	return fmt.Errorf("unknown %s %q: want one of %s", s.what, name, s)
}

// Covers panics unless implemented holds exactly the registered names: the implementing package
// calls it (from init) with the keys of its own table, so a registered name without an
// implementation, or an implementation without a registration, fails every test of that package.
func (s *Set) Covers(implemented []string) {
	got, want := slices.Sorted(slices.Values(implemented)), slices.Sorted(slices.Values(s.Names()))
	if !slices.Equal(got, want) {
		panic(fmt.Sprintf("choice: %s: implemented %v, registered %v", s.what, got, want))
	}
}
