package env

import (
	"math"
	"slices"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/llm"
)

// Rollout is one batch of episodes: N trajectories for each task, task-major
// (Trajectories[t*N+s] is sample s of Tasks[t]).
type Rollout struct {
	Iteration int
	// Version is the weights version that generated the rollout: the number of iterations whose
	// updates were behind the sampling weights (pkg/train's pipeline: rollout.max_staleness).
	Version      int
	N            int
	Agents       []string // the orchestra's agents in config order
	Tasks        []Task
	Schedule     Schedule // curriculum in force (zero for evaluation and orchestras without one)
	Trajectories []Trajectory
	// RewardStats counts what the outcome reward (reward.type judge or remote) did for the rollout;
	// nil under the orchestra's own rule checker.
	RewardStats RewardStats
	// Filter says what algorithm.filter_groups did (nil: off).
	Filter *GroupFilter
}

// GroupFilter counts, for one rollout, the prompt groups dropped for want of signal (every call
// scored alike), the batches of tasks rolled out, and the groups kept.
type GroupFilter struct {
	Dropped, Draws, Groups int
}

// Trajectory is one episode of the team on one task.
type Trajectory struct {
	UID       string // the task's group: the N trajectories of one task share it
	TrajUID   string // unique per trajectory
	TaskIndex int    // index of the task in Rollout.Tasks
	TaskID    string
	Sample    int     // 0..N−1 within the group
	Answer    string  // the final answer the team gave ("" when none)
	Answered  bool    // whether the team produced a final answer at all
	Reward    float64 // outcome reward shared by the team (rule: 1 when right, else 0; or the judge's / remote's score)
	Success   bool
	Injected  bool // curriculum: the needed fact was put into the team's context before turn 1
	Forced    bool // curriculum: turn 1 searched without asking the Verifier
	Calls     []Call
}

// Call is one agent call: what the agent saw and said, and the score its sample carries into training.
type Call struct {
	Agent    string
	Model    string
	Turn     int // 1-based turn (search) or Solver attempt (math)
	Prompt   string
	Messages []llm.Message
	Response string
	// Parsed is what the orchestra read from the response (verdict, query, answer); Valid whether the
	// response had the required form.
	Parsed     string
	Valid      bool
	RoleReward float64 // the agent's own reward term (see RewardConfig)
	// Score = (1 − w)·Reward + w·RoleReward − penalty·[!Valid], w the agent's role weight.
	Score       float64
	PromptIDs   []int
	ResponseIDs []int
	LogProbs    []float32
	Finish      llm.Finish
	Replica     string      // the engine replica that sampled the response ("" in-process)
	Version     llm.Version // the weights that sampled it on an engine (llm.Completion.Version; unknown in-process)
	// Routes are the experts a mixture-of-experts model routed the call's tokens to as it sampled
	// them (llm.Completion.Routes; nil for a dense model): what algorithm.routing_replay replays.
	Routes *llm.Routes
	// Tools are the function calls the response made and their results (a flow step with tools).
	Tools []ToolUse
}

// Sample is one training sample for pkg/normalize: an agent call with its group keys and score.
// Traj and Call index back into Rollout.Trajectories and Trajectory.Calls.
type Sample struct {
	UID     string
	TrajUID string
	Agent   string
	Score   float64
	Traj    int
	Call    int
}

// Samples lists every call of the rollout as a sample, in trajectory then call order.
func (r *Rollout) Samples() []Sample {
	var out []Sample
	for i := range r.Trajectories {
		t := &r.Trajectories[i]
		for j, c := range t.Calls {
			out = append(out, Sample{UID: t.UID, TrajUID: t.TrajUID, Agent: c.Agent, Score: c.Score, Traj: i, Call: j})
		}
	}
	return out
}

// MeanReward is the mean outcome reward over the rollout's trajectories.
func (r *Rollout) MeanReward() float64 {
	if len(r.Trajectories) == 0 {
		return 0
	}
	var s float64
	for _, t := range r.Trajectories {
		s += t.Reward
	}
	return s / float64(len(r.Trajectories))
}

// AgentStats are per-agent figures over a set of trajectories.
type AgentStats struct {
	Agent         string  `json:"agent"`
	Calls         int     `json:"calls"`
	CallsPerTraj  float64 `json:"calls_per_traj"`
	InvalidRate   float64 `json:"invalid_rate"` // fraction of this agent's calls that were invalid
	MeanScore     float64 `json:"mean_score"`
	ScoreStd      float64 `json:"score_std"` // population std of the call scores
	MeanRole      float64 `json:"mean_role_reward"`
	MeanRespToken float64 `json:"mean_response_tokens"` // len(ResponseIDs); 0 when the policy gave none
	MeanRespChars float64 `json:"mean_response_chars"`
}

// OverlongCalls counts the calls whose prompt left no room in the model's context
// (llm.FinishOverlong): invalid, nothing generated, nothing trained.
func (r *Rollout) OverlongCalls() int {
	n := 0
	for _, tr := range r.Trajectories {
		for _, c := range tr.Calls {
			if c.Finish == llm.FinishOverlong {
				n++
			}
		}
	}
	return n
}

// AgentStats computes per-agent figures over the rollout.
func (r *Rollout) AgentStats() []AgentStats { return ComputeAgentStats(r.Agents, r.Trajectories) }

// ComputeAgentStats computes per-agent figures over trajectories, one entry per agent in order.
func ComputeAgentStats(agents []string, trajs []Trajectory) []AgentStats {
	acc := newStatsAcc(agents)
	acc.add(trajs)
	return acc.result()
}

// AgentMetrics turns per-agent figures into metrics.jsonl keys (docs/contracts.md): calls/agent/<a>
// (calls per trajectory), invalid/agent/<a>, response_length/agent/<a> (tokens), reward/agent/<a>
// and score_std/agent/<a> (mean and std of the call scores), role_reward/agent/<a>.
func AgentMetrics(prefix string, stats []AgentStats) map[string]float64 {
	m := map[string]float64{}
	for _, s := range stats {
		m[prefix+"calls/agent/"+s.Agent] = s.CallsPerTraj
		m[prefix+"invalid/agent/"+s.Agent] = s.InvalidRate
		m[prefix+"response_length/agent/"+s.Agent] = s.MeanRespToken
		m[prefix+"reward/agent/"+s.Agent] = s.MeanScore
		m[prefix+"score_std/agent/"+s.Agent] = s.ScoreStd
		m[prefix+"role_reward/agent/"+s.Agent] = s.MeanRole
	}
	return m
}

// statsAcc accumulates per-agent sums over batches of trajectories.
type statsAcc struct {
	idx   map[string]int
	out   []AgentStats
	sq    []float64
	trajs int
}

func newStatsAcc(agents []string) *statsAcc {
	a := &statsAcc{idx: make(map[string]int, len(agents)), out: make([]AgentStats, len(agents)),
		sq: make([]float64, len(agents))}
	for i, name := range agents {
		a.idx[name] = i
		a.out[i].Agent = name
	}
	return a
}

func (a *statsAcc) add(trajs []Trajectory) {
	a.trajs += len(trajs)
	for _, t := range trajs {
		for _, c := range t.Calls {
			i, ok := a.idx[c.Agent]
			if !ok {
				continue
			}
			s := &a.out[i]
			s.Calls++
			if !c.Valid {
				s.InvalidRate++
			}
			s.MeanScore += c.Score
			a.sq[i] += c.Score * c.Score
			s.MeanRole += c.RoleReward
			s.MeanRespToken += float64(len(c.ResponseIDs))
			s.MeanRespChars += float64(utf8.RuneCountInString(c.Response))
		}
	}
}

// result turns the sums into means.
func (a *statsAcc) result() []AgentStats {
	out := slices.Clone(a.out)
	for i := range out {
		s := &out[i]
		if a.trajs > 0 {
			s.CallsPerTraj = float64(s.Calls) / float64(a.trajs)
		}
		if s.Calls == 0 {
			continue
		}
		n := float64(s.Calls)
		s.InvalidRate /= n
		s.MeanScore /= n
		s.ScoreStd = math.Sqrt(max(0, a.sq[i]/n-s.MeanScore*s.MeanScore))
		s.MeanRole /= n
		s.MeanRespToken /= n
		s.MeanRespChars /= n
	}
	return out
}

// Demo is one supervised demonstration: the messages an agent saw and the response to learn.
type Demo struct {
	Agent    string
	Model    string
	Messages []llm.Message
	Response string
}

// Demos turns every call of a rollout into a demonstration (the format warm-up of docs/toy-tasks.md runs
// an orchestra with a format-aware random policy and learns from its calls).
func Demos(r *Rollout) []Demo {
	var out []Demo
	for _, t := range r.Trajectories {
		for _, c := range t.Calls {
			out = append(out, Demo{Agent: c.Agent, Model: c.Model, Messages: c.Messages, Response: c.Response})
		}
	}
	return out
}
