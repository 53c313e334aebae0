package env

// Built-in role prompts. Each is a text/template over PromptData. The paper set follows the roles of
// the Dr. MAS reference systems; the toy set is a role letter plus the task and the context, a few
// tokens long, for tiny models that learn the format in a supervised warm-up (docs/toy-tasks.md).

const mathSolverPaper = `# Task
Solve the following math problem. Reason step by step and put your final answer within \boxed{}.

{{.Question}}
{{- if .Context}}

# Your teammates' outputs so far
{{.Context}}
{{- end}}

# Your role
You are the "Solver" (attempt {{.Turn}} of {{.MaxTurns}}). {{if .Context}}The Verifier rejected the latest solution: find the mistake and solve the problem again.{{else}}Solve the problem carefully.{{end}} End with the final answer within \boxed{}.`

const mathVerifierPaper = `# Task
Check a solution to the following math problem.

{{.Question}}

# Solution under review
{{.Response}}

# Your role
You are the "Verifier". Check each step, formula and the final answer of the solution above for correctness and completeness. End your output with exactly one verdict:
<verify>approve</verify> if the solution and its final answer are correct, or
<verify>reject</verify> if you find any error.`

// searchTask and searchContext open the search team's prompts: the question, then what the team has
// searched and retrieved so far.
const (
	searchTask    = "# Task\nAnswer the following question, using a search engine when needed.\n"
	searchContext = `Question: {{.Question}}
{{- if .Context}}

# Your team's searches and retrieved information so far
{{.Context}}
{{- end}}

# Your role
`
)

const searchVerifierPaper = searchTask + searchContext + `You are the "Verifier" and route the team. Judge whether the information above is sufficient to answer the question correctly. This is turn {{.Turn}} of at most {{.MaxTurns}}. Reason briefly, then end with exactly one decision:
<verify>yes</verify> if the information is sufficient to answer, or
<verify>no</verify> if more information must be searched for.`

const searchSearcherPaper = searchTask + searchContext + `You are the "Searcher". Write one search query for the information the team still lacks; do not repeat an earlier query. Put the query within <search> </search>, for example <search>capital of France</search>.`

const searchAnswererPaper = "# Task\nAnswer the following question.\n" + searchContext + `You are the "Answerer". Answer the question using the information above. Give only the short final answer within <answer> </answer>, for example <answer>Beijing</answer>.`

// Toy prompts: P(roblem) solver, C(heck) math verifier, V(erify) search verifier, S(earch), A(nswer).
const (
	mathSolverToy     = `P{{.Question}}{{.Context}}`
	mathVerifierToy   = `C{{.Question}}{{.Response}}`
	searchVerifierToy = `V{{.Question}}{{.Context}}`
	searchSearcherToy = `S{{.Question}}{{.Context}}`
	searchAnswererToy = `A{{.Question}}{{.Context}}`
)
