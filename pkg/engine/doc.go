// Package engine samples rollouts on serving-engine replicas (SGLang, vLLM, any OpenAI-compatible
// server, or `drmas serve`) instead of in-process: a Client (New) implements llm.Generator, so the
// orchestras cannot tell it from the local policy; Sync and Verify move the replicas to a new weights
// folder, LoadAdapter and UnloadAdapter manage LoRA adapters on them. A run keeps its engines in
// step with training through a Fleet (fleet.go: every model's client, the frozen bases serving
// their adapters, the managed replicas it starts) and a Publisher (publish.go: the weights folders
// under the run, each version a typed llm.Version carried by every completion).
//
// The trainer stays the owner of tokens: the Client renders the chat template and tokenizes with the
// trained model's own tokenizer, sends token ids with the agent's sampling settings and the request's
// seed, and takes back the sampled token ids and their log-probs (never a re-encoding of text). Many
// requests are kept in flight, spread over the replicas (least loaded first); a replica that fails is
// retried with backoff on the others. Sync makes every replica load a new weights folder and checks
// which version each one serves, so that no rollout starts on stale weights.
package engine
