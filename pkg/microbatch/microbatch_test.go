package microbatch

import (
	"math"
	"reflect"
	"testing"
)

func TestSplitByCount(t *testing.T) {
	got := Split([]int{5, 1, 9, 3, 2}, 2, 0)
	if want := [][]int{{0, 1}, {2, 3}, {4}}; !reflect.DeepEqual(got, want) {
		t.Errorf("count 2: %v, want %v", got, want)
	}
	if got := Split([]int{5, 1, 9}, 0, 0); !reflect.DeepEqual(got, [][]int{{0, 1, 2}}) {
		t.Errorf("count 0: %v, want one micro-batch of all", got)
	}
	if got := Split(nil, 2, 10); got != nil {
		t.Errorf("no sequences: %v", got)
	}
}

func TestSplitByTokens(t *testing.T) {
	lengths := []int{10, 40, 10, 100, 12, 40, 11, 10}
	got := Split(lengths, 2, 80)
	// sorted: 3(100) 1(40) 5(40) 4(12) 6(11) 0(10) 2(10) 7(10): 100 is alone (over half the budget),
	// the 40s fill 80, 12 and 11 are within 90% of each other, the 10s not of 12
	want := [][]int{{3}, {1, 5}, {4, 6}, {0, 2, 7}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("budget 80: %v, want %v", got, want)
	}
	for _, mb := range got {
		if len(mb) > 1 && len(mb)*lengths[mb[0]] > 80 {
			t.Errorf("micro-batch %v over the budget", mb)
		}
	}
	seen := map[int]bool{}
	for _, mb := range got {
		for _, i := range mb {
			seen[i] = true
		}
	}
	if len(seen) != len(lengths) {
		t.Errorf("indices %v: not each once", got)
	}
	padded, real := Cost(lengths, got)
	if padded != 100+80+24+30 || real != 233 {
		t.Errorf("cost %d padded, %d real", padded, real)
	}
	if p := Padding(lengths, Split(lengths, 8, 0)); math.Abs(p-(1-233.0/800)) > 1e-12 {
		t.Errorf("padding of one micro-batch %g", p)
	}
}

func TestPack(t *testing.T) {
	lengths := []int{10, 40, 10, 100, 12, 40, 11, 10}
	// sorted: 3(100) 1(40) 5(40) 4(12) 6(11) 0(10) 2(10) 7(10): 100 alone (over the budget), the
	// 40s fill a row, the short ones the next (53 tokens)
	if got, want := Pack(lengths, 80), [][]int{{3}, {1, 5}, {4, 6, 0, 2, 7}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("budget 80: %v, want %v", got, want)
	}
	// first fit, not next fit: 20 goes back to the first row, which has room
	if got, want := Pack([]int{60, 50, 30, 20}, 80), [][]int{{0, 3}, {1, 2}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("first fit: %v, want %v", got, want)
	}
	if got := Pack([]int{3, 5}, 0); !reflect.DeepEqual(got, [][]int{{1, 0}}) {
		t.Errorf("no budget: %v, want one row of all, longest first", got)
	}
	if got := Pack(nil, 10); got != nil {
		t.Errorf("no sequences: %v", got)
	}
}
