package plan

import (
	"github.com/drmas/drmas/pkg/algo"
	"github.com/drmas/drmas/pkg/team"
)

// heldTokenBytes is what a rollout held in memory costs per prompt or response token of a call: its
// id (8 bytes), its share of the call's text (the prompt, its messages and the response: ~8), a
// response token's log-prob (4), and the copy a checkpoint encodes (~4).
const heldTokenBytes = 24

// rolloutsAhead is the host memory of the rollouts generated ahead of training (rollout.max_staleness
// K, 0 when off): K rollouts of batch_size × group_size trajectories, each agent called at most as
// often as its orchestra allows (math: max_loop_num, search: max_turns, flow: max_calls), each call
// its model's prompt and response bound in tokens.
func rolloutsAhead(staleness int, tc team.Config, al algo.Config, models []Model) int64 {
	k := int64(staleness)
	if k <= 0 {
		return 0
	}
	calls := int64(1)
	switch o := tc.Orchestra; o.Type {
	case "math":
		calls = int64(o.MaxLoopNum)
	case "search":
		calls = int64(o.MaxTurns)
	case "flow":
		calls = int64(o.Flow.MaxCalls)
	}
	var perTraj int64
	for _, a := range tc.Agents {
		for _, m := range models {
			if m.ID == a.Model {
				perTraj = satSum(perTraj, satMul(calls, int64(m.PromptTokens+m.ResponseTokens)))
			}
		}
	}
	traj := int64(al.BatchSize) * int64(al.GroupSize)
	return satMul(satMul(k, traj), satMul(perTraj, heldTokenBytes))
}
