// Package serve is `drmas serve`: New wraps a loaded policy in a Server whose Handler speaks the
// protocols drmas's rollout engines speak — SGLang's native /generate and /update_weights_from_disk,
// the OpenAI /v1/completions and /v1/chat/completions, vLLM's dev-mode reload and LoRA endpoints —
// and ListenAndServe serves it, so checkpoints can be chatted with from any OpenAI client and
// trainings can sample on it as on a real engine.
//
// Concurrent requests are batched: a request waits at most a couple of milliseconds for others, and
// each batch is one call of the policy's batched generation, whose tokens leave as they are sampled
// (streamed as server-sent events when asked; a client that leaves ends its row). Requests answer in
// OpenAI's shapes, errors included. An API key guards every endpoint but /health; the endpoints that
// change the served weights are off unless enabled, and then read only under one root; timeouts, a
// bound on connections and one on the request bodies in flight keep slow or greedy clients from
// holding the server. Every request samples from its own
// seeded stream (sampling_seed / seed), so a request gets the same tokens whatever else shares its
// batch (up to floating-point noise of batched matmuls), and the same tokens as drmas's local engine.
package serve
