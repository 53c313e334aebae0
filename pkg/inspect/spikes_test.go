package inspect

import (
	"math"
	"slices"
	"testing"
)

// ones returns n copies of v.
func ones(n int, v float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func cat(parts ...[]float64) []float64 { return slices.Concat(parts...) }

var nan = math.NaN()

func TestSpikes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		factor float64
		window int
		want   []int
	}{
		{"flat then one spike", cat(ones(15, 1), []float64{6}, ones(5, 1)), 5, 20, []int{15}},
		{"exactly factor × median is not a spike", cat(ones(15, 1), []float64{5}), 5, 20, nil},
		{"before window/2 values nothing is flagged", cat(ones(3, 1), []float64{100}, ones(5, 1), []float64{100}), 5, 20, nil},
		{"one value short of window/2", cat(ones(9, 1), []float64{6}), 5, 20, nil},
		{"right at window/2", cat(ones(10, 1), []float64{6}), 5, 20, []int{10}},
		{"odd window needs ⌈window/2⌉", cat(ones(2, 1), []float64{6}, []float64{6}), 5, 5, []int{3}},
		// Nulls neither count toward window/2 nor enter the median; a null is never a spike.
		{"nulls do not count toward window/2", cat(ones(5, 1), ones(10, nan), ones(4, 1), []float64{6}), 5, 20, nil},
		{"nulls are skipped over", cat(ones(5, 1), ones(10, nan), ones(5, 1), []float64{6}), 5, 20, []int{20}},
		{"infinities are non-finite too", cat(ones(10, 1), []float64{math.Inf(1), 6}), 5, 20, []int{11}},
		// The window holds only the last 20 finite values: the early high plateau has left it.
		{"old values leave the window", cat(ones(20, 100), ones(20, 1), []float64{6}), 5, 20, []int{40}},
		// A level shift is flagged until the new level fills half the window, then accepted.
		{"plateau after a level shift", cat(ones(20, 1), ones(20, 100)), 5, 20, []int{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}},
		// The current value is excluded: with it, the median of (1, 10) would be 5.5 and 10 would pass.
		{"current value excluded", []float64{1, 1, 10}, 5, 2, []int{2}},
		{"median of an even window is the mean of the middle two", cat([]float64{1, 3}, []float64{10.01}), 5, 2, []int{2}},
		{"median of an even window, not above", cat([]float64{1, 3}, []float64{10}), 5, 2, nil},
		{"zero plateau flags any positive value", cat(ones(10, 0), []float64{1e-3}), 5, 20, []int{10}},
		{"window 1 compares with the previous value", []float64{1, 6, 7, 40}, 5, 1, []int{1, 3}},
		{"window 0 flags nothing", []float64{1, 100}, 5, 0, nil},
		{"empty", nil, 5, 20, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Spikes(tc.values, tc.factor, tc.window)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Spikes = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0, 1}, {0.5, 5.5}, {0.95, 9.55}, {1, 10}} {
		if got := quantile(s, tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("quantile(1..10, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := quantile([]float64{7}, 0.95); got != 7 {
		t.Errorf("quantile of one value = %v", got)
	}
	if got := quantile(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
}
