// Package toy makes the toy tasks that a tiny randomly initialised model can learn on a CPU in
// minutes (docs/toy-tasks.md): toy-math (the math orchestra on one-digit modular arithmetic) and
// toy-search (the search orchestra over a key→value corpus redrawn per question). Tasks generates a
// split, Orchestra gives a task's orchestra and agents, Demos the format warm-up's demonstrations.
//
// Data are generated deterministically from a seed; every answer, key and decision is one token of a
// char-level tokenizer that adds AddedTokens as single tokens.
package toy
