package inspect

import (
	"math"
	"sort"
)

// Spikes returns the indices i, ascending, of the spikes in values: finite values with
//
//	values[i] > factor × median(the previous `window` finite values, values[i] excluded),
//
// flagged only once at least ⌈window/2⌉ (and at least one) previous finite values exist, so the first
// noisy iterations of a run flag nothing. Non-finite values (NaN, ±Inf) are never spikes and do not enter
// any window; earlier spikes do, so a lasting level shift stops being flagged once it fills half the
// window. A median of 0 (a plateau of zero norms) flags any positive value. window < 1 gives nil.
func Spikes(values []float64, factor float64, window int) []int {
	if window < 1 {
		return nil
	}
	need := max(1, (window+1)/2)
	var spikes []int
	prev := make([]float64, 0, window) // the last `window` finite values, oldest first
	buf := make([]float64, 0, window)
	for i, v := range values {
		if !finite(v) {
			continue
		}
		if len(prev) >= need {
			buf = append(buf[:0], prev...)
			sort.Float64s(buf)
			if v > factor*quantile(buf, 0.5) {
				spikes = append(spikes, i)
			}
		}
		if len(prev) == window {
			prev = append(prev[:0], prev[1:]...)
		}
		prev = append(prev, v)
	}
	return spikes
}

// quantile returns the q-quantile of sorted (ascending, finite) by linear interpolation between the two
// nearest ranks (numpy's default): the median of an even count is the mean of the middle two. NaN if empty.
func quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	pos := q * float64(n-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, n-1)
	return sorted[lo] + (pos-float64(lo))*(sorted[hi]-sorted[lo])
}

// finiteSorted returns the finite values of vs, sorted ascending.
func finiteSorted(vs []float64) []float64 {
	var out []float64
	for _, v := range vs {
		if finite(v) {
			out = append(out, v)
		}
	}
	sort.Float64s(out)
	return out
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
