package torch

import (
	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// FirstNonFinite names the first of tensors (named by names, in the same order) that holds a NaN or
// an infinite value, "" when all are finite. Weights a reload, an adapter load or an export is about
// to serve or write are checked with it. On the torch thread.
func FirstNonFinite(names []string, tensors []*ts.Tensor) string {
	s := NewScope()
	defer s.Close()
	for i, t := range tensors {
		if t.MustIsfinite(false).MustAll(true).MustTotype(gotch.Int64, true).Int64Values()[0] == 0 {
			return names[i]
		}
	}
	return ""
}
