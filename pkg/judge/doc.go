// Package judge gives a team its outcome reward from outside drmas: an LLM judge on any
// OpenAI-compatible endpoint (Judge: a prompt template over the question, the answer and the
// reference, a score or verdict parsed from the reply, cached per distinct input) or a remote reward
// endpoint that scores whole trajectories sent as JSON (Remote). Reward combines either with the
// orchestra's rule checker (reward.judge.mode: judge alone, or fallback: the judge decides only what
// the rule cannot) and implements env.OutcomeReward, which env.WithOutcomeReward puts under an
// orchestra. Requests are bounded in concurrency and time and retried on transport errors; a
// failure is a named *Error (endpoint, kind, status, snippet) that fails the rollout, or, with
// on_error: score, a counted failure scored error_score, never a silent 0.
//
// The JSON contracts are in docs/contracts.md, the configuration in docs/rewards.md. Pure Go.
package judge
