package normalize

import (
	"fmt"
	"math"
	"strings"
)

// The rules an estimator's fields follow are written once, here: Spec.Check (config's
// algorithm.normalization, drmas advantages' flags and estimator specs, through Spec.Options) and
// Options.Validate (options built by hand) both apply them.

// A FieldError is one bad field of a spec or of options, by its key under algorithm.normalization.
type FieldError struct {
	Field   string   // "mean", "eps", "agents[1].preset"; "" for the spec as a whole
	Value   any      // the value given: a string or a float64 (nil for the spec as a whole)
	Allowed []string // a name field: the names it takes
	Want    string   // otherwise what the field takes, e.g. "a finite number ≥ 0"; for the spec as a whole, what it lacks
	err     error    // the message, when it is not the usual one
}

func (e *FieldError) Error() string {
	switch {
	case e.err != nil:
		return e.err.Error()
	case e.Field == "":
		return e.Want
	case e.Allowed != nil:
		return fmt.Sprintf("%s %q: want %s", e.Field, e.Value, orList(e.Allowed))
	default:
		return fmt.Sprintf("%s %v: want %s", e.Field, e.Value, e.Want)
	}
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// nameFields are the fields of Options and Spec that take a name, with the names each takes, in the
// order their errors are reported.
var nameFields = []struct {
	key     string
	allowed []string
	opt     func(*Options) string
	spec    func(*Spec) string
}{
	{"mean", []string{Global, Agent}, func(o *Options) string { return o.Mean }, func(s *Spec) string { return s.Mean }},
	{"std", []string{Global, Agent, None}, func(o *Options) string { return o.Std }, func(s *Spec) string { return s.Std }},
	{"weighting", []string{Step, Trajectory}, func(o *Options) string { return o.Weighting }, func(s *Spec) string { return s.Weighting }},
	{"group", []string{ByAgent, ByAgentTurn}, func(o *Options) string { return o.Group }, func(s *Spec) string { return s.Group }},
	{"global", []string{OverTrajectories, OverCalls}, func(o *Options) string { return o.Global }, func(s *Spec) string { return s.Global }},
}

// checkName wants v to be one of allowed.
func checkName(field, v string, allowed []string) *FieldError {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return &FieldError{Field: field, Value: v, Allowed: allowed}
}

// checkEps wants ε finite and ≥ MinEps.
func checkEps(v float64) *FieldError {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < MinEps {
		return &FieldError{Field: "eps", Value: v, Want: fmt.Sprintf("a finite number ≥ %g", MinEps)}
	}
	return nil
}

// checkMinStd wants the σ floor finite and ≥ 0.
func checkMinStd(v float64) *FieldError {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return &FieldError{Field: "min_std", Value: v, Want: "a finite number ≥ 0"}
	}
	return nil
}

// checkPreset wants a name of Presets(); field is the preset's key.
func checkPreset(field, name string) *FieldError {
	if _, err := Preset(name); err != nil {
		return &FieldError{Field: field, Value: name, Allowed: Presets(), err: err}
	}
	return nil
}

// Check reports every bad field of the spec: an unknown preset, neither a preset nor both mean and
// std, a name field set to a name it does not take, ε or min_std out of range, an override without
// an agent name or with an unknown preset. A spec without problems resolves (Options) into valid
// options, which are not checked again.
func (s Spec) Check() []*FieldError {
	var errs []*FieldError
	add := func(e *FieldError) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if s.Preset != "" {
		add(checkPreset("preset", s.Preset))
	} else if s.Mean == "" || s.Std == "" {
		add(&FieldError{Want: fmt.Sprintf("name a preset (%s) or set both mean and std", strings.Join(Presets(), ", "))})
	}
	for _, f := range nameFields {
		if v := f.spec(&s); v != "" {
			add(checkName(f.key, v, f.allowed))
		}
	}
	add(checkEps(s.Eps))
	add(checkMinStd(s.MinStd))
	for i, a := range s.Agents {
		k := fmt.Sprintf("agents[%d]", i)
		if a.Name == "" {
			add(&FieldError{Field: k + ".name", Value: "", Want: "the name of an agent",
				err: fmt.Errorf("%s: agent override %q: empty agent name", k, "="+a.Preset)})
			continue
		}
		if e := checkPreset(k+".preset", a.Preset); e != nil {
			e.err = fmt.Errorf("%s: agent %s: %w", k, a.Name, e.err)
			add(e)
		}
	}
	return errs
}
