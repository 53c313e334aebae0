package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// GenLengths draws the response length of each generated prompt: "N" (every response N tokens) or
// "lognormal:MEDIAN:SIGMA:MIN:MAX" (exp of a normal of mean ln MEDIAN and deviation SIGMA, rounded
// and clipped to [MIN, MAX]: long-tailed, as real responses are).
type GenLengths struct {
	Median, Sigma float64
	Min, Max      int
}

// ParseGenLengths reads a --gen-lengths spec (see GenLengths).
func ParseGenLengths(spec string) (GenLengths, error) {
	if n, err := strconv.Atoi(spec); err == nil {
		if n <= 0 {
			return GenLengths{}, fmt.Errorf("response length %d: want > 0", n)
		}
		return GenLengths{Median: float64(n), Min: n, Max: n}, nil
	}
	parts := strings.Split(spec, ":")
	if len(parts) != 5 || parts[0] != "lognormal" {
		return GenLengths{}, fmt.Errorf("response lengths %q: want N or lognormal:MEDIAN:SIGMA:MIN:MAX", spec)
	}
	var g GenLengths
	var errs [4]error
	g.Median, errs[0] = strconv.ParseFloat(parts[1], 64)
	g.Sigma, errs[1] = strconv.ParseFloat(parts[2], 64)
	g.Min, errs[2] = strconv.Atoi(parts[3])
	g.Max, errs[3] = strconv.Atoi(parts[4])
	for _, err := range errs {
		if err != nil {
			return GenLengths{}, fmt.Errorf("response lengths %q: %w", spec, err)
		}
	}
	if g.Median <= 0 || g.Sigma < 0 || g.Min <= 0 || g.Max < g.Min {
		return GenLengths{}, fmt.Errorf("response lengths %q: want MEDIAN > 0, SIGMA ≥ 0, 0 < MIN ≤ MAX", spec)
	}
	return g, nil
}

// Draw returns n lengths drawn with seed.
func (g GenLengths) Draw(n int, seed int64) []int {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x1e9))
	out := make([]int, n)
	for i := range out {
		x := int(math.Round(g.Median * math.Exp(g.Sigma*rng.NormFloat64())))
		out[i] = min(max(x, g.Min), g.Max)
	}
	return out
}
