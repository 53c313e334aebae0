package policytest

import (
	"strings"
	"testing"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// Adapter makes a float32 adapter named name for base whose B matrices (embed_tokens: A) are drawn from N(0, std²)
// with torch's generator seeded by seed (a new adapter's B is zero, so it would generate exactly what
// the base does), saves it to dir in PEFT's layout unless dir is empty, and returns it. It enters
// torch.Do itself: call it from the test's goroutine.
func Adapter(t testing.TB, base *policy.Model, dir, name string, cfg policy.LoRAConfig, seed int64, std float64) *policy.Adapter {
	t.Helper()
	var a *policy.Adapter
	err := torch.Do(func() error {
		var err error
		if a, err = policy.NewAdapter(base, name, cfg, gotch.Float, seed); err != nil {
			return err
		}
		if err := torch.NoGrad(func() error {
			s := torch.NewScope()
			defer s.Close()
			torch.ManualSeed(seed)
			for _, prm := range a.Parameters() {
				if strings.HasSuffix(prm.Name, "lora_B.weight") || strings.HasSuffix(prm.Name, "lora_embedding_A") {
					prm.T.Copy_(ts.MustRandn(prm.T.MustSize(), gotch.Float, gotch.CPU).MustMulScalar(ts.FloatScalar(std), true))
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if dir == "" {
			return nil
		}
		return a.Save(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Load reads the policy folder dir on the CPU in float32 as policy "toy" (the tests' toy model),
// failing the test on an error. It enters torch.Do itself.
func Load(t testing.TB, dir string) *policy.Policy {
	t.Helper()
	var p *policy.Policy
	if err := torch.Do(func() error {
		var err error
		p, err = policy.LoadPolicy("toy", dir, gotch.CPU, gotch.Float)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return p
}
