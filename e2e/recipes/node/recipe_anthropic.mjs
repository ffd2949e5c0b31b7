// llmgate's recipe for the Anthropic TypeScript SDK (npm
// "@anthropic-ai/sdk"): the gateway as the base URL, the gateway key as the
// API key, and an Idempotency-Key per call. The README's "TypeScript
// (@anthropic-ai/sdk)" recipe is this file; e2e/recipes_anthropic_test.go
// runs it against the real gateway.
import Anthropic from "@anthropic-ai/sdk";

// baseURL is the gateway's root (http://127.0.0.1:8080), not .../v1: the
// SDK appends /v1/messages itself. apiKey is the gateway key llmgate gave
// you (the SDK sends it as Authorization: Bearer, which llmgate takes like
// x-api-key), never the provider's key, which stays in the gateway's
// config. Pass both explicitly: otherwise the SDK reads ANTHROPIC_BASE_URL,
// ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN from the environment.
//
// Leave the SDK's retries on (maxRetries: 2 by default): it obeys
// x-should-retry before any status rule. llmgate says true only where a
// retry with the same key is right (a key still in flight, a client
// deadline); every failure it has already retried upstream says false, so
// the SDK throws at once instead of multiplying the gateway's attempts.
export function newClient(baseURL, apiKey) {
  return new Anthropic({ baseURL, apiKey });
}

// The key names the business operation, not the attempt: the SDK resends
// the same headers on its retries, and a caller that runs the step again
// (after a crash, from a queue) must derive the same key.
export function key(orderId) {
  return `order-${orderId}/summarize`;
}

function params(text) {
  return { model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: `Summarize: ${text}` }] };
}

// The key goes in `headers`. Not the `idempotencyKey` request option: the
// SDK accepts it but sends no header for it, so it deduplicates nothing.
// Errors are Anthropic.APIError (status, type), llmgate's own in
// Anthropic's shape too. `.withResponse()` shows Idempotent-Replayed: true
// on an answer replayed from the gateway's store.
export function summarize(client, orderId, text, options = {}) {
  return client.messages.create(params(text), {
    ...options,
    headers: { ...options.headers, "Idempotency-Key": key(orderId) },
  });
}

// The same call streamed; `await summarizeStream(...).finalMessage()` is
// the whole message. A keyed stream that llmgate replays is the committed
// stream, byte for byte. A stream that fails mid-way ends in an error event
// from llmgate, never a clean end, so finalMessage() rejects instead of
// returning a short message as complete; calling again with the same key
// runs it again (a failed stream is not committed).
export function summarizeStream(client, orderId, text, options = {}) {
  return client.messages.stream(params(text), {
    ...options,
    headers: { ...options.headers, "Idempotency-Key": key(orderId) },
  });
}
