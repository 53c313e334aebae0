// Package llm is the seam between the multi-agent side (pkg/env) and whatever generates text: the
// in-process policy (pkg/policy), a serving-engine client, or a test's scripted fake, all behind the
// Generator interface. It holds only the request and completion types (Request, Sampling, Message,
// Completion, Router), so that env and policy both import it and neither imports the other.
package llm
