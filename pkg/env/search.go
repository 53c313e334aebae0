package env

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/drmas/drmas/pkg/env/answer"
)

// searchRoles are the agents of the search orchestra.
var searchRoles = []Role{
	{Name: "verifier", Parse: TagParser("verify", VerdictYes, VerdictNo),
		Prompts: map[string]string{PromptsPaper: searchVerifierPaper, PromptsToy: searchVerifierToy}},
	{Name: "searcher", Parse: TagParser("search"),
		Prompts: map[string]string{PromptsPaper: searchSearcherPaper, PromptsToy: searchSearcherToy}},
	{Name: "answerer", Parse: TagParser("answer"),
		Prompts: map[string]string{PromptsPaper: searchAnswererPaper, PromptsToy: searchAnswererToy}},
}

// searchOrchestra routes each turn through the Verifier (<verify>yes|no</verify>): no → the Searcher
// emits <search>query</search> and the retriever's top-k come back as <information> in the team's
// context; yes → the Answerer emits <answer>…</answer> and the episode ends. An unparseable verdict
// counts as yes (invalid call); a search without a query retrieves nothing and uses up the turn
// (invalid call); max_turns turns without an answer give reward 0. The reward is exact match after
// QA normalization with any gold answer.
//
// The training curriculum (docs/toy-tasks.md) may, per episode, skip the turn-1 Verifier and search first
// (Trajectory.Forced) and put the needed fact into the team's context before turn 1, as if it had
// been retrieved (Trajectory.Injected): every agent sees it, and the Verifier's role reward counts
// it, so "yes" is right once the fact is in view and the Answerer learns to copy it.
type searchOrchestra struct {
	*team
	verifier, searcher, answerer *Agent
}

func newSearch(s setup) (Orchestra, error) {
	if s.retr == nil {
		return nil, errors.New("search orchestra: needs a retriever (env.FactRetriever for tasks that carry their facts)")
	}
	t, err := newTeam("search", s, searchRoles)
	if err != nil {
		return nil, err
	}
	return &searchOrchestra{team: t, verifier: t.byName["verifier"], searcher: t.byName["searcher"],
		answerer: t.byName["answerer"]}, nil
}

// Schedule evaluates the curriculum at a training iteration.
func (o *searchOrchestra) Schedule(iteration int) Schedule { return o.cfg.Curriculum.At(iteration) }

// Run plays n trajectories of every task.
func (o *searchOrchestra) Run(ctx context.Context, gen llm.Generator, tasks []Task, n int, opts RunOptions) (*Rollout, error) {
	began := time.Now()
	var sched Schedule
	if !opts.Eval {
		sched = o.Schedule(opts.Iteration)
	}
	r, active, err := o.start(tasks, n, opts, sched)
	if err != nil {
		return nil, err
	}
	o.curriculum(active, opts, sched)
	maxTurns := o.cfg.MaxTurns
	for turn := 1; turn <= maxTurns && len(active) > 0; turn++ {
		toSearch, toAnswer, err := o.verify(ctx, gen, active, turn, opts)
		if err != nil {
			return nil, err
		}
		if err := o.searchOrAnswer(ctx, gen, toSearch, toAnswer, turn, opts); err != nil {
			return nil, err
		}
		active = toSearch
	}
	for _, e := range active {
		o.finish(e, "", false, false) // turn limit without an answer
	}
	logRun(o.typ, r, began)
	return r, nil
}

// curriculum draws, per episode, whether it skips the turn-1 Verifier (Forced) and whether the
// needed fact is put into the team's context before turn 1 (Injected).
func (o *searchOrchestra) curriculum(active []*episode, opts RunOptions, sched Schedule) {
	for _, e := range active {
		e.traj.Forced = sched.ForceSearchP > 0 && draw(opts, "force_search", e.traj) < sched.ForceSearchP
		if sched.InjectP > 0 && len(e.task.Support) > 0 && draw(opts, "inject", e.traj) < sched.InjectP {
			e.traj.Injected = true
			facts := factDocs(e.task.Support)
			e.docs = append(e.docs, facts...)
			e.entries = append(e.entries, entry{text: o.style.information(facts)})
		}
	}
}

// verify asks the Verifier of every active episode (but a forced search's on turn 1) whether the
// team has enough to answer, rewarding a verdict that matches the documents in view; no sends an
// episode to the Searcher, yes (or an invalid verdict) to the Answerer.
func (o *searchOrchestra) verify(ctx context.Context, gen llm.Generator, active []*episode, turn int, opts RunOptions) (toSearch, toAnswer []*episode, err error) {
	var route []pending
	for _, e := range active {
		if turn == 1 && e.traj.Forced {
			toSearch = append(toSearch, e)
			continue
		}
		route = append(route, o.ask(o.verifier, e, turn))
	}
	idx, err := o.generate(ctx, gen, route, opts)
	if err != nil {
		return nil, nil, err
	}
	for i, p := range route {
		e := p.ep
		c := &e.traj.Calls[idx[i]]
		yes := !c.Valid || c.Parsed == VerdictYes
		c.RoleReward = b2f(c.Valid && yes == enough(e.task, e.docs))
		e.entries = append(e.entries, entry{agent: o.verifier.Name, text: c.Response, verdict: true})
		if yes {
			toAnswer = append(toAnswer, e)
		} else {
			toSearch = append(toSearch, e)
		}
	}
	return toSearch, toAnswer, nil
}

// searchOrAnswer runs the Searcher and the Answerer in the same step, one Generate call for both:
// an answer ends its episode with its reward, a valid query retrieves documents into the team's
// context.
func (o *searchOrchestra) searchOrAnswer(ctx context.Context, gen llm.Generator, toSearch, toAnswer []*episode, turn int, opts RunOptions) error {
	ps := make([]pending, 0, len(toSearch)+len(toAnswer))
	for _, e := range toSearch {
		ps = append(ps, o.ask(o.searcher, e, turn))
	}
	for _, e := range toAnswer {
		ps = append(ps, o.ask(o.answerer, e, turn))
	}
	idx, err := o.generate(ctx, gen, ps, opts)
	if err != nil {
		return err
	}
	var searching []*episode
	var queries []string
	for i, e := range toSearch {
		c := &e.traj.Calls[idx[i]]
		e.entries = append(e.entries, entry{agent: o.searcher.Name, text: c.Response})
		if c.Valid {
			searching = append(searching, e)
			queries = append(queries, c.Parsed)
		}
	}
	for i, e := range toAnswer {
		c := &e.traj.Calls[idx[len(toSearch)+i]]
		correct := c.Valid && answer.ExactMatch(c.Parsed, e.task.Answers)
		c.RoleReward = b2f(correct)
		o.finish(e, c.Parsed, c.Valid, correct)
	}
	return o.search(ctx, searching, queries)
}

// ask builds an agent's pending call.
func (o *searchOrchestra) ask(a *Agent, e *episode, turn int) pending {
	return pending{ep: e, agent: a, data: PromptData{Question: e.task.Question, Context: o.style.context(e.entries),
		Turn: turn, MaxTurns: o.cfg.MaxTurns}}
}

// factDocs wraps facts as documents.
func factDocs(facts []string) []Doc {
	docs := make([]Doc, len(facts))
	for i, f := range facts {
		docs[i] = Doc{ID: "fact", Contents: f, Score: 1}
	}
	return docs
}

// hit reports whether docs hold one of the task's needed facts (Task.Support) or, for a task without
// them, a gold answer: the searcher's role reward.
func hit(t *Task, docs []Doc) bool {
	if len(t.Support) == 0 {
		return holdsAnswer(docs, t.Answers)
	}
	for _, f := range t.Support {
		if holdsFact(docs, f) {
			return true
		}
	}
	return false
}

// enough reports whether docs hold all of the task's needed facts or, for a task without them, a gold
// answer: the truth a search verifier's verdict is scored against.
func enough(t *Task, docs []Doc) bool {
	if len(t.Support) == 0 {
		return holdsAnswer(docs, t.Answers)
	}
	for _, f := range t.Support {
		if !holdsFact(docs, f) {
			return false
		}
	}
	return true
}

func holdsFact(docs []Doc, fact string) bool {
	fact = strings.TrimSpace(fact)
	for _, d := range docs {
		if strings.Contains(d.Contents, fact) {
			return true
		}
	}
	return false
}

// holdsAnswer reports whether a document contains a gold answer as whole words after QA normalization.
func holdsAnswer(docs []Doc, golds []string) bool {
	for _, d := range docs {
		text := " " + answer.NormalizeQA(d.Contents) + " "
		for _, g := range golds {
			if g := answer.NormalizeQA(g); g != "" && strings.Contains(text, " "+g+" ") {
				return true
			}
		}
	}
	return false
}
