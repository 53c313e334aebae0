package bench

import (
	"slices"
	"testing"
)

func TestGenLengths(t *testing.T) {
	g, err := ParseGenLengths("lognormal:150:1:16:1024")
	if err != nil {
		t.Fatal(err)
	}
	if g != (GenLengths{Median: 150, Sigma: 1, Min: 16, Max: 1024}) {
		t.Fatalf("parsed %+v", g)
	}
	a := g.Draw(64, 1)
	if !slices.Equal(a, g.Draw(64, 1)) || slices.Equal(a, g.Draw(64, 2)) {
		t.Fatal("draws are not a function of the seed")
	}
	s := slices.Sorted(slices.Values(a))
	if s[0] < 16 || s[63] > 1024 || s[32] < 75 || s[32] > 300 || s[63] < 4*s[32] {
		t.Fatalf("lengths %v: want a median near 150 and a long tail within [16, 1024]", s)
	}
	f, err := ParseGenLengths("40")
	if err != nil || !slices.Equal(f.Draw(3, 1), []int{40, 40, 40}) {
		t.Fatalf("fixed: %+v %v", f, err)
	}
	for _, bad := range []string{"0", "lognormal:150:1:16", "normal:1:1:1:2", "lognormal:150:1:32:16", "lognormal:x:1:1:2", "lognormal:-1:1:1:2"} {
		if _, err := ParseGenLengths(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
