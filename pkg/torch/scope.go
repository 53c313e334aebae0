package torch

import "github.com/sugarme/gotch/ts"

// Scope records every tensor created while it is the innermost open scope and frees them all on Close,
// except those handed to Keep, which move to the enclosing scope (or, at the outermost level, to the
// caller, who owns them). Scopes make the memory of a step flat without relying on the Go GC.
// Scopes belong to the torch thread (see Do) and must be closed in reverse order of opening.
type Scope struct {
	tensors []*ts.Tensor
	scalars []*ts.Scalar // freed on Close, never kept: a scalar is an op's argument, used at once
	kept    map[*ts.Tensor]bool
	parent  *Scope
}

var current *Scope

func init() {
	ts.NewTensorHook = func(t *ts.Tensor) {
		if current != nil {
			current.tensors = append(current.tensors, t)
		}
	}
	// Scalars (ts.FloatScalar(x) …) made inside a scope are freed with it, not at a later garbage
	// collection: long-lived small C blocks split the holes freed tensors leave in the heap, and it
	// grows. A scalar made outside any scope (a package variable) keeps gotch's finalizer.
	ts.NewScalarHook = func(sc *ts.Scalar) {
		if current != nil {
			current.scalars = append(current.scalars, sc)
		}
	}
}

// NewScope opens a scope nested in the current one.
func NewScope() *Scope {
	s := &Scope{parent: current}
	current = s
	return s
}

// Keep marks tensors to survive this scope's Close; they are handed to the enclosing scope.
func (s *Scope) Keep(tensors ...*ts.Tensor) {
	if s.kept == nil {
		s.kept = make(map[*ts.Tensor]bool, len(tensors))
	}
	for _, t := range tensors {
		s.kept[t] = true
	}
}

// Close frees every tensor created in the scope that was not kept, and makes the parent current.
func (s *Scope) Close() {
	if current == s {
		current = s.parent
	}
	for _, t := range s.tensors {
		if s.kept[t] {
			if s.parent != nil {
				s.parent.tensors = append(s.parent.tensors, t)
			}
			continue
		}
		t.MustDrop()
	}
	for _, sc := range s.scalars {
		sc.Free()
	}
	s.tensors, s.scalars = nil, nil
	s.kept = nil
}

// Scoped runs fn in a new scope and frees what it created, except the tensors fn returns, which the
// caller owns afterwards (or the enclosing scope, if any).
func Scoped(fn func() ([]*ts.Tensor, error)) ([]*ts.Tensor, error) {
	s := NewScope()
	defer s.Close()
	out, err := fn()
	if err == nil {
		s.Keep(out...)
	}
	return out, err
}

// Untracked runs fn with no scope recording (for tensors that live long, like model weights).
func Untracked(fn func() error) error {
	saved := current
	current = nil
	defer func() { current = saved }()
	return fn()
}
