package train

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/report"
)

// The progress bar moves within an iteration: it shows the rollout's trajectories as they finish and
// its calls and tokens as they return, then each mini-batch of the update, at growing positions,
// before the iteration ends.
func TestProgressWithinIteration(t *testing.T) {
	var out bytes.Buffer
	train(t, tinyConfig(t, t.TempDir(), "run.steps=2", "algorithm.ppo_mini_update_num=2"), Options{Progress: report.NewTerminal(&out)})
	first, _, ok := strings.Cut(out.String(), "iteration 1/2 done")
	if !ok {
		t.Fatalf("no end of iteration 1 on the bar:\n%q", out.String())
	}
	frames := strings.Split(first, "\r")
	want := []string{"iteration 1/2: rollout", "iteration 1/2: rollout 0/16 trajectories, 16 calls", "iteration 1/2: rollout 16/16 trajectories",
		"iteration 1/2: update small, mini-batch 1/2", "iteration 1/2: update small, mini-batch 2/2"}
	pct := regexp.MustCompile(`(\d+)%`)
	last, found := -1, 0
	for _, f := range frames {
		if found < len(want) && strings.Contains(f, want[found]) {
			m := pct.FindStringSubmatch(f)
			if m == nil {
				t.Fatalf("frame without a percentage: %q", f)
			}
			p, _ := strconv.Atoi(m[1])
			if p < last || p >= 50 {
				t.Errorf("%q at %d%% (after %d%%): want growing positions within the first of 2 iterations", want[found], p, last)
			}
			last = p
			found++
		}
	}
	if found < len(want) {
		t.Fatalf("the bar showed %d of the phases %q within iteration 1:\n%q", found, want, first)
	}
}
