package arch

import (
	"fmt"
	"slices"
	"strings"
)

// ExpandTargets checks target module names and returns them in LoRAModules order, "all-linear"
// standing for every projection (not embed_tokens or lm_head, as in PEFT).
func ExpandTargets(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("target_modules: none given (want %s or some of %s)", LoRAAllLinear, strings.Join(LoRAModules, ", "))
	}
	want := map[string]bool{}
	for _, n := range names {
		switch {
		case n == LoRAAllLinear:
			for _, p := range LoRATargets {
				want[p] = true
			}
		case slices.Contains(LoRAModules, n):
			want[n] = true
		default:
			return nil, fmt.Errorf("target_modules: %q is not a module an adapter can target (want %s or some of %s)", n, LoRAAllLinear, strings.Join(LoRAModules, ", "))
		}
	}
	var out []string
	for _, p := range LoRAModules {
		if want[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// LoRAShapes lists the element counts of the A and B tensors of an adapter of rank r on the given
// targets of a model of configuration c (for memory plans), without building anything.
func LoRAShapes(c Config, r int, targets []string) ([]int64, error) {
	t, err := ExpandTargets(targets)
	if err != nil {
		return nil, err
	}
	c.FillDefaults()
	o := OptionsOf(c)
	q, kv := o.Heads*o.HeadDim, o.KVHeads*o.HeadDim
	dims := map[string][2]int64{"q_proj": {o.Hidden, q}, "k_proj": {o.Hidden, kv}, "v_proj": {o.Hidden, kv}, "o_proj": {q, o.Hidden},
		"gate_proj": {o.Hidden, o.Inter}, "up_proj": {o.Hidden, o.Inter}, "down_proj": {o.Inter, o.Hidden}}
	dims[LoRAEmbed] = [2]int64{o.Vocab, o.Hidden}
	dims[LoRAHead] = [2]int64{o.Hidden, o.Vocab}
	var out []int64
	for range c.NumHiddenLayers {
		for _, p := range t {
			if slices.Contains(LoRATargets, p) {
				out = append(out, int64(r)*dims[p][0], int64(r)*dims[p][1])
			}
		}
	}
	for _, p := range t {
		if !slices.Contains(LoRATargets, p) {
			out = append(out, int64(r)*dims[p][0], int64(r)*dims[p][1])
		}
	}
	return out, nil
}

// LoRAParams is the number of adapter parameters of rank r on the given targets of a model of
// configuration c (the sum of LoRAShapes).
func LoRAParams(c Config, r int, targets []string) (int64, error) {
	sizes, err := LoRAShapes(c, r, targets)
	var n int64
	for _, s := range sizes {
		n += s
	}
	return n, err
}
